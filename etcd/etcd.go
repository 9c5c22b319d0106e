package etcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/batch"
	"github.com/dlock-go/dlock/internal/sharedctx"
)

// Defaults for Options and the DSN parameters.
const (
	// DefaultPrefix is the etcd key prefix under which the driver names its
	// locks (see LockName). DSN: the path.
	DefaultPrefix = "/dlock"

	// DefaultRequestTimeout bounds each request the driver sends (see
	// Options.RequestTimeout). DSN parameter "request-timeout".
	DefaultRequestTimeout = 5 * time.Second

	// DefaultDialTimeout bounds connecting to the cluster when opening a DSN.
	// DSN parameter "dial-timeout".
	DefaultDialTimeout = 5 * time.Second

	// DefaultPort is the client port of a DSN host without one.
	DefaultPort = "2379"
)

var errClosed = fmt.Errorf("etcd driver: %w", backend.ErrClosed)

func init() {
	backend.Register("etcd", open)
	backend.Register("etcds", open)
}

// Options configure a Driver. The zero value, or a nil *Options, gives the
// defaults.
type Options struct {
	// Prefix is the etcd key prefix of the driver's locks (see LockName),
	// without its trailing '/'. Empty means DefaultPrefix ("/dlock"). DSN:
	// the path.
	Prefix string

	// RequestTimeout bounds, on the client, each request the driver sends
	// (not the wait for a held lock, nor a refresh, which the lease's
	// deadline bounds). Zero means DefaultRequestTimeout (5s); negative is an
	// error. DSN parameter "request-timeout".
	RequestTimeout time.Duration
}

func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	r.Prefix = strings.TrimRight(r.Prefix, "/")
	if r.Prefix == "" {
		r.Prefix = DefaultPrefix
	}
	switch {
	case r.RequestTimeout == 0:
		r.RequestTimeout = DefaultRequestTimeout
	case r.RequestTimeout < 0:
		return r, fmt.Errorf("request timeout must be > 0, got %v", r.RequestTimeout)
	}
	return r, nil
}

// Driver is the etcd implementation of backend.Driver. Its methods are safe
// for concurrent use. Most programs use it through dlock.Open or New; build
// one with NewDriver to pass to dlock.New with your own options.
type Driver struct {
	cli     *clientv3.Client
	owned   bool // Close closes cli
	prefix  string
	timeout time.Duration
	bound   *sharedctx.Bound // timeout, shared by requests whose ctx cannot end (reqCtx)

	bg   context.Context // cancelled by Close: ends the loss watch
	loss lossWatch       // watch.go

	keyChecks *batch.Batcher[keyCheck, bool] // the refreshes' shared key checks (renew.go)
	stopBg    context.CancelFunc
	wg        sync.WaitGroup // loss watchers and background revocations

	watchGen atomic.Int32 // watchUnknown, watchLegacy or watchModern

	granting chan struct{} // one shared lease grant at a time (shared.go)

	permitSeq atomic.Uint64 // numbers a permit's keys and names (semaphore.go)

	mu     sync.Mutex
	closed bool
	shared map[int64]*lease   // the shared lease in use, by the TTL asked for in seconds (shared.go)
	idle   map[int64][]*lease // released leases of their own for reuse, by the TTL asked for in seconds
}

var (
	_ backend.Driver = (*Driver)(nil)
	_ backend.Named  = (*Driver)(nil)
)

// NewDriver returns a driver that locks through cli, with opts nil for the
// defaults. The caller keeps cli, and closes it only after the driver (or
// the Locker over it).
// It checks that the cluster answers, bounded by ctx and
// Options.RequestTimeout, as Open does.
func NewDriver(ctx context.Context, cli *clientv3.Client, opts *Options) (*Driver, error) {
	d, err := newDriver(cli, opts)
	if err != nil {
		return nil, err
	}
	rctx, cancel := d.reqCtx(ctx) // bounded by the request timeout
	err = d.checkCluster(rctx)
	cancel()
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	return d, nil
}

// checkCluster reads the number of keys under the prefix: the cluster answers
// and the client's credentials work. clientv3 waits for a connection without
// bound: ctx must bound it.
func (d *Driver) checkCluster(ctx context.Context) error {
	if _, err := d.cli.Get(ctx, d.prefix, clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("etcd at %s: %w", strings.Join(d.cli.Endpoints(), ","), err)
	}
	return nil
}

// newDriver is NewDriver without the I/O: it checks its arguments and builds
// the driver.
func newDriver(cli *clientv3.Client, opts *Options) (*Driver, error) {
	if cli == nil {
		return nil, fmt.Errorf("%w: nil etcd client", dlock.ErrInvalidOption)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	bg, stop := context.WithCancel(context.Background())
	d := &Driver{
		cli:      cli,
		prefix:   o.Prefix,
		timeout:  o.RequestTimeout,
		bound:    sharedctx.New(o.RequestTimeout),
		bg:       bg,
		stopBg:   stop,
		idle:     map[int64][]*lease{},
		shared:   map[int64]*lease{},
		granting: make(chan struct{}, 1),
	}
	d.keyChecks = batch.NewBatcher(keyCheckGap, &d.wg, d.checkKeysBatch)
	return d, nil
}

// New returns a dlock.Locker over cli: dlock.New(NewDriver(ctx, cli, opts),
// lockerOpts...). ctx bounds NewDriver's check of the cluster only. opts may
// be nil for the defaults. Closing the Locker does not close cli.
func New(ctx context.Context, cli *clientv3.Client, opts *Options, lockerOpts ...dlock.Option) (dlock.Locker, error) {
	d, err := NewDriver(ctx, cli, opts)
	if err != nil {
		return nil, &dlock.Error{Op: "open", Backend: "etcd", Err: err}
	}
	return dlock.New(d, lockerOpts...) // closes d if it fails
}

// Name returns "etcd".
func (d *Driver) Name() string { return "etcd" }

// Prefix returns the prefix of the driver's locks (see LockName).
func (d *Driver) Prefix() string { return d.prefix }

// LockName returns the name of key's lock under the driver's prefix: the name
// `etcdctl lock` and concurrency.NewMutex take to exclude dlock's holders of
// key. See the package-level LockName.
func (d *Driver) LockName(key string) string { return LockName(d.prefix, key) }

// LockName returns the name of the lock for a dlock key under prefix: prefix,
// '/', and the key with '%', '/', 0x00–0x1F and 0x7F escaped as "%XX"
// (LockName("/dlock", "jobs/nightly") is "/dlock/jobs%2Fnightly"). Holders
// and waiters are the keys under it + "/": "write/<lease hex>" and
// "read/<lease hex>", as in etcd's recipes RWMutex.
func LockName(prefix, key string) string {
	var b strings.Builder
	b.Grow(len(prefix) + 1 + len(key))
	b.WriteString(prefix)
	b.WriteByte('/')
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c == '%' || c == '/' || c < 0x20 || c == 0x7f {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// Capabilities reports strict fencing, FIFO push-based waiting, fault
// tolerance, server-side expiry, loss notification, shared locks and counted
// semaphores.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Fencing:         backend.FencingStrict,
		FIFO:            true,
		FaultTolerant:   true,
		TimeAuthority:   backend.TimeServer,
		PushWait:        true,
		LossNotify:      true,
		Shared:          true,
		NativeSemaphore: true,
	}
}

// Close revokes the driver's leases, stops its watches and goroutines, and
// closes the client if it opened it. A second Close fails with ErrClosed.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return errClosed
	}
	d.closed = true
	var idle []*lease
	for _, ls := range d.idle {
		idle = append(idle, ls...)
	}
	for _, ls := range d.shared {
		idle = append(idle, ls)
	}
	d.idle, d.shared = nil, nil
	d.mu.Unlock()

	d.stopBg()
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	var wg sync.WaitGroup
	for _, ls := range idle {
		wg.Go(func() { _, _ = d.cli.Revoke(ctx, ls.id) })
	}
	wg.Wait()
	cancel()
	d.wg.Wait()
	d.bound.Stop()
	if d.owned {
		return d.cli.Close()
	}
	return nil
}

// open is the OpenFunc for the schemes "etcd" and "etcds".
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	cfg, o, err := parseDSN(u)
	if err != nil {
		if errors.Is(err, dlock.ErrInvalidOption) { // from Params.Done
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", strings.Join(cfg.Endpoints, ","), backend.RedactError(err, u))
	}
	d, err := newDriver(cli, &o)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	d.owned = true
	// Check the cluster answers (and the credentials work) within ctx and the
	// dial timeout.
	cctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	err = d.checkCluster(cctx)
	cancel()
	if err != nil {
		_ = d.Close()
		return nil, backend.RedactError(err, u)
	}
	return d, nil
}

// parseDSN turns a DSN into a client configuration and driver options.
func parseDSN(u *url.URL) (clientv3.Config, Options, error) {
	var cfg clientv3.Config
	p := backend.NewParams(u)
	o := Options{
		Prefix:         u.Path,
		RequestTimeout: p.Duration("request-timeout", DefaultRequestTimeout),
	}
	cfg.DialTimeout = p.Duration("dial-timeout", DefaultDialTimeout)
	ca, cert, key := p.String("ca", ""), p.String("cert", ""), p.String("key", "")
	if err := p.Done(); err != nil {
		return cfg, o, err
	}
	if u.Opaque != "" {
		return cfg, o, fmt.Errorf("DSN must look like %s://host:2379/prefix", u.Scheme)
	}
	if u.Fragment != "" {
		return cfg, o, errors.New("DSN has a fragment ('#…'); escape '#' in a prefix as %23")
	}
	hosts, err := backend.SplitHosts(u.Host, DefaultPort)
	if err != nil {
		return cfg, o, fmt.Errorf("DSN: %w", err)
	}
	cfg.Endpoints = hosts
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
		if cfg.Username == "" {
			return cfg, o, errors.New("DSN has a password but no user name")
		}
	}
	switch u.Scheme {
	case "etcds":
		tc, err := tlsConfig(ca, cert, key)
		if err != nil {
			return cfg, o, err
		}
		cfg.TLS = tc
	default:
		if ca != "" || cert != "" || key != "" {
			return cfg, o, errors.New("parameters ca, cert and key need the scheme etcds:// (TLS)")
		}
	}
	// A dead connection (a partitioned or paused member) is noticed by gRPC
	// keep-alive pings, so requests move to another member. 10s is the
	// shortest interval gRPC allows; etcd accepts pings every 5s.
	cfg.DialKeepAliveTime = 10 * time.Second
	cfg.DialKeepAliveTimeout = 3 * time.Second
	cfg.Logger = zap.NewNop()
	return cfg, o, nil
}

// tlsConfig builds the client TLS configuration of an etcds DSN.
func tlsConfig(ca, cert, key string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("parameter ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("parameter ca: no PEM certificate in %s", ca)
		}
		tc.RootCAs = pool
	}
	if (cert == "") != (key == "") {
		return nil, errors.New("parameters cert and key go together")
	}
	if cert != "" {
		c, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("parameters cert and key: %w", err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	return tc, nil
}
