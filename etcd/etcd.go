// Package etcd is dlock's driver for etcd v3, through go.etcd.io/etcd/client/v3.
// Importing it registers the DSN schemes "etcd" and "etcds" (TLS) with
// dlock.Open:
//
//	import _ "github.com/dlock-go/dlock/etcd"
//
//	locker, err := dlock.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks?ttl=10s")
//
// To use a *clientv3.Client built in code, call [New] or [NewDriver].
//
// # What is guaranteed
//
// etcd is a Raft cluster: a lock survives the loss of a minority of its
// members, and a granted lock is committed to a majority before anyone is told.
//
// A lock is a key attached to an etcd lease. The server deletes the key when
// the lease expires, on its own clock: a holder that stops renewing loses the
// lock after its TTL. Each grant has its own lease (a lease is reused by later
// grants of the same driver once released, never shared by two grants at once),
// so a lease that is not renewed — auto-renew off, a paused or crashed process —
// really expires.
//
// The fencing token is the create revision of the holder's key: etcd's
// cluster-wide revision, which strictly increases with every write and
// survives restarts, leader changes and compaction. Tokens therefore strictly
// increase per key across every grant, release, expiry and failover
// ([backend.FencingStrict]).
//
// Waiters queue in the order their keys were created and each watches only its
// predecessor's key ([backend.Capabilities] FIFO and PushWait; no thundering
// herd). A watch is started in sync with the server (not from a past revision,
// which etcd serves from a catch-up loop that runs every 100ms), and the
// predecessor is checked again once the watch is in place, so no deletion is
// missed and a hand-off takes a few round trips, not 100ms. (etcd before 3.5,
// such as Debian 12's 3.4, still puts some of those watches on the slow path
// under heavy write load; against such a cluster a waiter opens a second watch
// a round trip after the first.) A waiter renews its own lease every TTL/3, so
// a long wait keeps its place in the queue; if its lease is lost anyway,
// Acquire returns an error.
//
// Refresh renews the lease (one keep-alive request) and checks that the
// holder's key is still there with its create revision. Release deletes the key
// in a transaction conditional on that create revision, so a stale or retried
// release can never delete a newer holder's key: it reports the loss instead
// (dlock.ErrLeaseLost). Validity is counted from the moment the grant or
// keep-alive request was sent, less backend.DriftAllowance, on the monotonic
// clock; dlock ends the lease at that deadline unless a renewal succeeds.
// Besides, a held key is watched (from 20ms after the grant, so short leases
// cost no watch), and its deletion — lease expired or revoked, key deleted
// by hand — closes Grant.Lost at once (LossNotify). clientv3's Session.Done is
// not used: it can fire late under a partition.
//
// # TTLs
//
// etcd lease TTLs are whole seconds with a server minimum (2s with the default
// election timeout of 1s). The driver rounds a TTL up to whole seconds; the
// server may raise it to its minimum; the lease's deadline is computed from
// the TTL the server granted, so it is never shorter than asked for and never
// longer than the truth. A TTL ≤ 0 is an error (clientv3 would silently make
// it 60s).
//
// A lease survives the loss of the cluster's leader only if it can be renewed
// in time: the last renewal may be TTL/3 old when the leader fails, and
// electing a new one takes 2–3s with etcd's default 1s election timeout. Keep
// two thirds of the TTL above that: at least 5s by default (dlock's default
// TTL is 15s).
//
// # Key layout and interoperability
//
// For dlock key K and prefix P (default "/dlock"), the lock's name is
//
//	P/E(K)
//
// where E escapes '%', '/', the control bytes 0x00–0x1F and 0x7F as "%XX"
// (upper-case hex, as in URLs) and keeps every other byte, so that the mapping
// is injective and the name has no '/' of its own: "jobs/nightly" becomes
// "/dlock/jobs%2Fnightly" ([LockName]). Holders and waiters are the keys
//
//	P/E(K)/<lease ID in hex>
//
// each attached to its lease; the one with the lowest create revision holds
// the lock. This is exactly the layout of etcd's own concurrency.Mutex and of
// `etcdctl lock`, so dlock clients, `etcdctl lock /dlock/jobs%2Fnightly` and
// Go programs using concurrency.NewMutex(session, "/dlock/jobs%2Fnightly")
// exclude each other and queue together. Two drivers on one cluster must not
// use nested prefixes (such as "/a" and "/a/b"), or their lock names can
// overlap.
//
// # DSN
//
//	etcd://[user:password@]host[:port][,host[:port]...][/prefix][?param=value&...]
//	etcds://...   the same over TLS
//
// A host without a port uses 2379. (Go's URL parser wants a port on the last
// host if any host has one, and takes at most one IPv6 literal; for more, build
// the client in code and use NewDriver.) The path is the prefix (default "/dlock", a
// trailing '/' is dropped): "etcd://h:2379/locks" uses "/locks". User and
// password enable etcd authentication. Parameters read by the driver:
//
//	dial-timeout     bound on connecting to the cluster (default 5s)
//	request-timeout  bound on each request (default 5s; see Options.RequestTimeout)
//	ca               etcds: file of PEM CA certificates (default: the system's)
//	cert, key        etcds: files of the PEM client certificate and its key
//
// Parameters read by dlock for every backend: "ttl" and "autorenew". Any other
// parameter is an error. Errors never contain the password.
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
)

// Defaults for Options and the DSN parameters.
const (
	// DefaultPrefix is the etcd key prefix under which the driver names its
	// locks (see the package doc's Key layout). DSN: the path.
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

var errClosed = errors.New("etcd driver closed")

func init() {
	backend.Register("etcd", open)
	backend.Register("etcds", open)
}

// Options configure a Driver. The zero value, or a nil *Options, gives the
// defaults.
type Options struct {
	// Prefix is the etcd key prefix of the driver's locks (see the package
	// doc's Key layout). A trailing '/' is dropped. Empty means DefaultPrefix
	// ("/dlock"). DSN: the path.
	Prefix string

	// RequestTimeout bounds each request the driver sends on its own
	// initiative or on behalf of an Acquire, TryAcquire or Release: a
	// transaction, a read, a lease grant or revocation. It does not bound
	// waiting for a held lock (the caller's ctx does), nor a refresh, which
	// dlock bounds by the lease's deadline and which the driver retries,
	// member after member, until then. Zero means DefaultRequestTimeout (5s);
	// negative is an error. DSN parameter "request-timeout".
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

	bg     context.Context // cancelled by Close: ends loss watchers
	stopBg context.CancelFunc
	wg     sync.WaitGroup // loss watchers and background revocations

	watchGen atomic.Int32 // watchUnknown, watchLegacy or watchModern

	mu     sync.Mutex
	closed bool
	idle   map[int64][]*lease // released leases for reuse, by the TTL asked for in seconds
}

var (
	_ backend.Driver = (*Driver)(nil)
	_ backend.Named  = (*Driver)(nil)
)

// NewDriver returns a driver that locks through cli. opts may be nil for the
// defaults.
//
// The caller keeps ownership of cli: the driver's Close does not close it.
// Close cli only after closing the driver (or the Locker over it).
func NewDriver(cli *clientv3.Client, opts *Options) (*Driver, error) {
	if cli == nil {
		return nil, fmt.Errorf("%w: nil etcd client", dlock.ErrInvalidOption)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	bg, stop := context.WithCancel(context.Background())
	return &Driver{
		cli:     cli,
		prefix:  o.Prefix,
		timeout: o.RequestTimeout,
		bg:      bg,
		stopBg:  stop,
		idle:    map[int64][]*lease{},
	}, nil
}

// New returns a dlock.Locker over cli: dlock.New(NewDriver(cli, opts),
// lockerOpts...). opts may be nil for the defaults. Closing the Locker does not
// close cli.
func New(cli *clientv3.Client, opts *Options, lockerOpts ...dlock.Option) (dlock.Locker, error) {
	d, err := NewDriver(cli, opts)
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
// '/', and the key with '%', '/', 0x00–0x1F and 0x7F escaped as "%XX". Holders
// and waiters are the keys LockName(prefix, key) + "/" + lease ID in hex, as
// concurrency.Mutex lays them out. LockName("/dlock", "jobs/nightly") is
// "/dlock/jobs%2Fnightly". The mapping is injective: two different keys never
// share a name.
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

// Capabilities reports strict fencing (create revisions), FIFO push-based
// waiting, fault tolerance, server-side expiry and immediate loss notification.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Fencing:       backend.FencingStrict,
		FIFO:          true,
		FaultTolerant: true,
		TimeAuthority: backend.TimeServer,
		PushWait:      true,
		LossNotify:    true,
	}
}

// Close revokes the leases the driver keeps for reuse, stops its watches and
// goroutines, and closes the client if the driver opened it (a client given
// to NewDriver or New stays open). dlock releases every lease before it calls
// Close. A second Close returns nil.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	var idle []*lease
	for _, ls := range d.idle {
		idle = append(idle, ls...)
	}
	d.idle = nil
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
	if d.owned {
		return d.cli.Close()
	}
	return nil
}

// open is the OpenFunc for the schemes "etcd" and "etcds".
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	cfg, o, err := parseDSN(u)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", strings.Join(cfg.Endpoints, ","), backend.RedactError(err, u))
	}
	d, err := NewDriver(cli, &o)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	d.owned = true
	// Check the cluster answers (and the credentials work) within ctx and the
	// dial timeout: clientv3 otherwise waits for a connection without bound.
	cctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	_, err = cli.Get(cctx, d.prefix, clientv3.WithCountOnly())
	cancel()
	if err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("etcd at %s: %w", strings.Join(cfg.Endpoints, ","), backend.RedactError(err, u))
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
	if err := p.Done("dial-timeout", "request-timeout", "ca", "cert", "key", "ttl", "autorenew"); err != nil {
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
