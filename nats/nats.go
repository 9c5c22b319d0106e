package nats

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// Defaults for Options and the DSN parameters.
const (
	// DefaultBucket is the key-value bucket of the driver's locks. DSN: the
	// path.
	DefaultBucket = "dlock"

	// DefaultRequestTimeout bounds each request the driver sends. DSN
	// parameter "request-timeout".
	DefaultRequestTimeout = 5 * time.Second

	// DefaultDialTimeout bounds connecting when opening a DSN. DSN parameter
	// "dial-timeout".
	DefaultDialTimeout = 5 * time.Second

	// DefaultPollInterval is the longest a waiting Acquire goes without
	// trying again when its watch reports nothing. DSN parameter "poll".
	DefaultPollInterval = 5 * time.Second

	// DefaultMarkerTTL is how long a bucket the driver creates keeps the
	// markers of deleted and expired keys (LimitMarkerTTL).
	DefaultMarkerTTL = time.Minute

	// DefaultPort is the client port of a DSN host without one.
	DefaultPort = "4222"
)

// cancelGrace is how long a write is given to answer after the caller's ctx
// ends: its answer says whether it took the lock, which must then be given
// back.
const cancelGrace = time.Second

var errClosed = fmt.Errorf("nats driver: %w", backend.ErrClosed)

func init() {
	backend.Register("nats", open)
}

// Options configure a Driver. The zero value, or a nil *Options, gives the
// defaults.
type Options struct {
	// Bucket is the key-value bucket of the driver's locks. NewDriver creates
	// it if it does not exist (with Replicas replicas, file storage, history 1
	// and per-message TTLs); an existing bucket must allow per-message TTLs.
	// Empty means DefaultBucket ("dlock"). DSN: the path.
	Bucket string

	// Replicas is the number of replicas of a bucket NewDriver creates: 3
	// survives the loss of one server of a cluster. Zero means 1. DSN
	// parameter "replicas".
	Replicas int

	// RequestTimeout bounds each request the driver sends (not the wait for
	// a held lock). Zero means DefaultRequestTimeout (5s); negative is an
	// error. DSN parameter "request-timeout".
	RequestTimeout time.Duration

	// PollInterval is the longest a waiting Acquire goes without trying
	// again when its watch reports nothing (jittered), a fallback for a
	// watch that missed a change. Zero means DefaultPollInterval (5s);
	// negative is an error. DSN parameter "poll".
	PollInterval time.Duration
}

func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Bucket == "" {
		r.Bucket = DefaultBucket
	}
	if !validBucket(r.Bucket) {
		return r, fmt.Errorf("bucket name %q: use letters, digits, '-' and '_'", r.Bucket)
	}
	switch {
	case r.Replicas == 0:
		r.Replicas = 1
	case r.Replicas < 0 || r.Replicas > 5:
		return r, fmt.Errorf("replicas must be 1 to 5, got %d", r.Replicas)
	}
	switch {
	case r.RequestTimeout == 0:
		r.RequestTimeout = DefaultRequestTimeout
	case r.RequestTimeout < 0:
		return r, fmt.Errorf("request timeout must be > 0, got %v", r.RequestTimeout)
	}
	switch {
	case r.PollInterval == 0:
		r.PollInterval = DefaultPollInterval
	case r.PollInterval < 0:
		return r, fmt.Errorf("poll interval must be > 0, got %v", r.PollInterval)
	}
	return r, nil
}

func validBucket(b string) bool {
	for _, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return b != ""
}

// Driver is the NATS JetStream implementation of backend.Driver. Its methods
// are safe for concurrent use. Most programs use it through dlock.Open or New.
type Driver struct {
	nc      *natsgo.Conn
	owned   bool // Close closes nc
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	legacy  natsgo.JetStreamContext // for reads through the stream's leader (readKey)
	bucket  string
	subject string // "$KV.<bucket>.": a key's subject is subject+KeyName(key)
	timeout time.Duration
	poll    time.Duration
	replica int // the bucket's replicas, as the server reports them

	markerTTL time.Duration // the bucket's LimitMarkerTTL: a release's purge marker lasts as long

	watch *watcher // the bucket's watch, shared by the waits and the held locks

	bg     context.Context // cancelled by Close: ends the watches and waits
	stopBg context.CancelFunc
	wg     sync.WaitGroup // the watches' goroutines (spawn)

	mu     sync.Mutex // orders spawn and Close
	closed atomic.Bool
}

// spawn runs f in a goroutine that Close waits for, unless the driver is
// closed (false).
func (d *Driver) spawn(f func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return false
	}
	d.wg.Go(f)
	return true
}

var (
	_ backend.Driver = (*Driver)(nil)
	_ backend.Named  = (*Driver)(nil)
)

// NewDriver returns a driver that locks through nc in the bucket of opts
// (nil for the defaults), creating the bucket if it does not exist. The
// caller keeps nc, and closes it only after the driver (or the Locker over
// it). ctx bounds the bucket's lookup or creation.
func NewDriver(ctx context.Context, nc *natsgo.Conn, opts *Options) (*Driver, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil nats connection", dlock.ErrInvalidOption)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	legacy, err := nc.JetStream()
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	rctx, cancel := context.WithTimeout(ctx, o.RequestTimeout)
	defer cancel()
	kv, cfg, err := bucket(rctx, js, o)
	if err != nil {
		return nil, err
	}
	bg, stop := context.WithCancel(context.Background())
	d := &Driver{
		nc:      nc,
		js:      js,
		legacy:  legacy,
		kv:      kv,
		bucket:  o.Bucket,
		subject: "$KV." + o.Bucket + ".",
		timeout: o.RequestTimeout,
		poll:    o.PollInterval,
		replica: cfg.Replicas,

		markerTTL: max(cfg.SubjectDeleteMarkerTTL, time.Second),
		bg:        bg,
		stopBg:    stop,
	}
	d.watch = newWatcher(d)
	if testDrivers != nil {
		testDrivers.Store(d, nil)
	}
	return d, nil
}

// bucket opens the bucket of o, or creates it, and checks that it allows
// per-message TTLs; it returns the bucket's stream configuration.
func bucket(ctx context.Context, js jetstream.JetStream, o Options) (jetstream.KeyValue, jetstream.StreamConfig, error) {
	var none jetstream.StreamConfig
	kv, err := js.KeyValue(ctx, o.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:         o.Bucket,
			Description:    "dlock locks",
			History:        1,
			Storage:        jetstream.FileStorage,
			Replicas:       o.Replicas,
			LimitMarkerTTL: DefaultMarkerTTL,
		})
		if errors.Is(err, jetstream.ErrBucketExists) { // created meanwhile
			kv, err = js.KeyValue(ctx, o.Bucket)
		}
	}
	if err != nil {
		if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
			return nil, none, fmt.Errorf("bucket %s: the server has no per-message TTLs (nats-server 2.11 or later has): %w", o.Bucket, err)
		}
		return nil, none, fmt.Errorf("bucket %s: %w", o.Bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, none, fmt.Errorf("bucket %s: %w", o.Bucket, err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || bs.StreamInfo() == nil {
		return nil, none, fmt.Errorf("bucket %s: no stream information", o.Bucket)
	}
	cfg := bs.StreamInfo().Config
	if !cfg.AllowMsgTTL || cfg.SubjectDeleteMarkerTTL <= 0 {
		return nil, none, fmt.Errorf("%w: bucket %s does not allow per-message TTLs with markers (create it with LimitMarkerTTL, or let the driver create it)",
			dlock.ErrInvalidOption, o.Bucket)
	}
	return kv, cfg, nil
}

// New returns a dlock.Locker over nc: dlock.New(NewDriver(ctx, nc, opts),
// lockerOpts...). Closing the Locker does not close nc.
func New(ctx context.Context, nc *natsgo.Conn, opts *Options, lockerOpts ...dlock.Option) (dlock.Locker, error) {
	d, err := NewDriver(ctx, nc, opts)
	if err != nil {
		return nil, &dlock.Error{Op: "open", Backend: "nats", Err: err}
	}
	return dlock.New(d, lockerOpts...) // closes d if it fails
}

// Name returns "nats".
func (d *Driver) Name() string { return "nats" }

// Bucket returns the name of the key-value bucket of the driver's locks.
func (d *Driver) Bucket() string { return d.bucket }

// Capabilities reports strict fencing, server-side expiry, push-based
// waiting and loss notification; fault tolerance where the bucket has 3
// replicas or more; no FIFO order, shared locks or counted semaphores.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Fencing:       backend.FencingStrict,
		FIFO:          false,
		FaultTolerant: d.replica >= 3,
		TimeAuthority: backend.TimeServer,
		PushWait:      true,
		LossNotify:    true,
	}
}

// Close stops the driver's watches and waits, and closes the connection if
// it opened it. A second Close fails with ErrClosed.
func (d *Driver) Close() error {
	d.mu.Lock()
	closed := d.closed.Swap(true)
	d.mu.Unlock()
	if closed {
		return errClosed
	}
	d.stopBg()
	d.wg.Wait()
	if testDrivers != nil {
		testDrivers.Delete(d)
	}
	if d.owned {
		d.nc.Close()
	}
	return nil
}

// KeyName returns the bucket key of a dlock key: the key with every byte
// other than ASCII letters, digits, '-', '_' and '/' written as "=XX" (hex),
// so that distinct keys get distinct names and a name is a valid key
// (KeyName("jobs/nightly.1") is "jobs/nightly=2E1").
func KeyName(key string) string {
	var b strings.Builder
	b.Grow(len(key))
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '/' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// open is the OpenFunc for the scheme "nats".
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	p := backend.NewParams(u)
	o := Options{
		Replicas:       p.Int("replicas", 1, 1, 5),
		RequestTimeout: p.Duration("request-timeout", DefaultRequestTimeout),
		PollInterval:   p.Duration("poll", DefaultPollInterval),
	}
	dial := p.Duration("dial-timeout", DefaultDialTimeout)
	if err := p.Done(); err != nil {
		return nil, err
	}
	servers, copts, err := parseDSN(u, &o)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	if _, err := o.withDefaults(); err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	copts = append(copts, natsgo.Timeout(dial))
	nc, err := natsgo.Connect(strings.Join(servers, ","), copts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", strings.Join(servers, ","), backend.RedactError(err, u))
	}
	d, err := NewDriver(ctx, nc, &o)
	if err != nil {
		nc.Close()
		return nil, backend.RedactError(err, u)
	}
	d.owned = true
	return d, nil
}

// parseDSN reads the servers, the bucket and the credentials of a DSN.
func parseDSN(u *url.URL, o *Options) (servers []string, copts []natsgo.Option, err error) {
	if u.Opaque != "" {
		return nil, nil, errors.New("DSN must look like nats://host:4222/bucket")
	}
	if u.Fragment != "" {
		return nil, nil, errors.New("DSN has a fragment ('#…')")
	}
	o.Bucket = strings.Trim(u.Path, "/")
	if strings.Contains(o.Bucket, "/") {
		return nil, nil, errors.New("DSN path must be one bucket name")
	}
	hosts, err := backend.SplitHosts(u.Host, DefaultPort)
	if err != nil {
		return nil, nil, fmt.Errorf("DSN: %w", err)
	}
	for _, h := range hosts {
		servers = append(servers, "nats://"+h)
	}
	copts = []natsgo.Option{
		natsgo.Name("dlock"),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(100 * time.Millisecond),
		natsgo.RetryOnFailedConnect(false),
		// The DSN's servers only: a cluster's other addresses, which the
		// servers announce, may not be reachable (or wanted) from here.
		natsgo.IgnoreDiscoveredServers(),
		// A dead connection (a partitioned or paused server) is noticed
		// within about 4s, and the client moves to another server.
		natsgo.PingInterval(2 * time.Second),
		natsgo.MaxPingsOutstanding(2),
	}
	if u.User != nil {
		user := u.User.Username()
		pass, hasPass := u.User.Password()
		switch {
		case hasPass && user == "":
			return nil, nil, errors.New("DSN has a password but no user name")
		case hasPass:
			copts = append(copts, natsgo.UserInfo(user, pass))
		case user != "":
			copts = append(copts, natsgo.Token(user))
		}
	}
	return servers, copts, nil
}
