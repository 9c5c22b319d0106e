package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/third_party/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/batch"
)

// Defaults for Options and the DSN parameters.
const (
	// DefaultRoot is the node under which every lock lives. DSN: the path.
	DefaultRoot = "/dlock"

	// DefaultSessionTimeout is the session timeout Dial asks the servers for.
	// DSN parameter "session".
	DefaultSessionTimeout = 10 * time.Second

	// DefaultConnectTimeout bounds Dial's and NewDriver's wait for the first
	// session, on top of their ctx. DSN parameter "connect".
	DefaultConnectTimeout = 10 * time.Second

	// DefaultPort is the port of a DSN host given without one.
	DefaultPort = 2181
)

const (
	// cleanupTimeout bounds how long Acquire waits for the deletion of a node
	// it gives up on; the deletion goes on in the background if it has to.
	cleanupTimeout = 2 * time.Second
	// closeWait bounds how long Close waits for go-zookeeper's goroutines, and
	// for the driver's own calls on a connection the driver does not own.
	closeWait = 5 * time.Second
	// statePoll is how often the state of a connection the driver does not
	// own is read (go-zookeeper reports its events only to its creator).
	statePoll = 50 * time.Millisecond
)

var errClosed = fmt.Errorf("zookeeper driver: %w", backend.ErrClosed)

func init() {
	backend.Register("zk", open)
}

// Options configure a Driver. The zero value, or a nil *Options, gives the
// defaults.
type Options struct {
	// Root is the node under which every lock lives: an absolute path other
	// than "/", such as "/dlock" or "/myapp/locks". Empty means DefaultRoot.
	// DSN: the path.
	Root string

	// SessionTimeout is, for Dial, the session timeout to ask for (the
	// servers clamp it); zero means DefaultSessionTimeout (10s). For
	// NewDriver and New it is required, and at most the timeout conn
	// negotiated: leases' validity is computed from it. DSN parameter
	// "session".
	SessionTimeout time.Duration

	// ConnectTimeout bounds how long Dial and NewDriver wait for the first
	// session, on top of their ctx. Zero means DefaultConnectTimeout (10s).
	// DSN parameter "connect".
	ConnectTimeout time.Duration

	// Digest is "user:password" for ZooKeeper digest authentication (Dial
	// only; on a connection of your own, call conn.AddAuth). DSN: the user
	// info. Default: none.
	Digest string

	// ACL is the ACL of the key, lock and lease nodes. Default: with Digest,
	// all permissions for its identity and read for anyone; without, open.
	// DSN parameter "acl", as ZooKeeper's command line writes it
	// ("digest:app:HASH:cdrwa,world:anyone:r"); docs/zookeeper.md, ACLs.
	ACL []zk.ACL

	// RootACL is the ACL of the root and of the nodes above it that the
	// driver creates, which every client of the root shares. Default: open,
	// zk.WorldACL(zk.PermAll). DSN parameter "rootacl", written as "acl".
	RootACL []zk.ACL

	// Logger receives go-zookeeper's log lines (Dial only). Default: they are
	// discarded.
	Logger zk.Logger
}

func (o *Options) withDefaults(dialing bool) (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Root == "" {
		r.Root = DefaultRoot
	}
	if err := checkRoot(r.Root); err != nil {
		return r, err
	}
	switch {
	case r.SessionTimeout < 0:
		return r, fmt.Errorf("session timeout must be > 0, got %v", r.SessionTimeout)
	case r.SessionTimeout == 0 && dialing:
		r.SessionTimeout = DefaultSessionTimeout
	case r.SessionTimeout == 0:
		return r, errors.New("Options.SessionTimeout is required with a connection of your own: give the session timeout the server negotiated for it")
	}
	switch {
	case r.ConnectTimeout < 0:
		return r, fmt.Errorf("connect timeout must be > 0, got %v", r.ConnectTimeout)
	case r.ConnectTimeout == 0:
		r.ConnectTimeout = DefaultConnectTimeout
	}
	if r.Digest != "" && !strings.Contains(r.Digest, ":") {
		return r, errors.New(`digest credentials must read "user:password"`)
	}
	if len(r.ACL) == 0 {
		r.ACL = defaultACL(r.Digest != "")
	}
	if len(r.RootACL) == 0 {
		r.RootACL = zk.WorldACL(zk.PermAll)
	}
	if r.Logger == nil {
		r.Logger = discard{}
	}
	return r, nil
}

type discard struct{}

func (discard) Printf(string, ...any) {}

// Driver is the ZooKeeper implementation of backend.Driver. Its methods are
// safe for concurrent use. Most programs use it through dlock.Open or New;
// build one with Dial or NewDriver to pass to dlock.New with your own options.
type Driver struct {
	conn    *zk.Conn
	owned   bool            // Close closes conn (it was dialled by Dial)
	events  <-chan zk.Event // owned connections: closed once go-zookeeper is done
	root    string
	acl     []zk.ACL // of key, lock and lease nodes (Options.ACL)
	rootACL []zk.ACL // of the root and the nodes above it
	// identity names the client in refusals: "digest:<user>",
	// "anonymous", or "" when unknown (a connection of the caller's).
	identity string
	timeout  time.Duration // asked for (Dial) or declared (NewDriver)

	sess   *sessions
	syncs  *batch.Group  // the refreshes' shared syncs (renew.go)
	quit   chan struct{} // closed by Close
	closed atomic.Bool
	wg     sync.WaitGroup // every goroutine the driver starts

	// Connections the driver dials (see wire.go).
	wireMu    sync.Mutex
	wire      *wireConn
	handshake handshake
	severed   bool    // test hook: the process "crashed"
	dropOp    int32   // test hook: drop the reply to the next request with this opcode
	breakOp   int32   // test hook: break the connection as the next request with this opcode is written
	sentOps   []int32 // test hook: opcodes of the requests sent while recordOps
	recordOps bool
}

var (
	_ backend.Driver = (*Driver)(nil)
	_ backend.Named  = (*Driver)(nil)
)

func newDriver(o Options) *Driver {
	d := &Driver{
		root:    o.Root,
		acl:     o.ACL,
		rootACL: o.RootACL,
		timeout: o.SessionTimeout,
		sess:    newSessions(),
		quit:    make(chan struct{}),
	}
	d.syncs = batch.New(syncGap, &d.wg, d.syncRoot)
	return d
}

// Dial connects to the ZooKeeper servers ("host:port", DefaultPort if none)
// and returns, once they grant a session, a driver that owns the connection;
// it fails when ctx ends or Options.ConnectTimeout passes first. opts may be
// nil for the defaults.
func Dial(ctx context.Context, servers []string, opts *Options) (*Driver, error) {
	o, err := opts.withDefaults(true)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("%w: no ZooKeeper server given", dlock.ErrInvalidOption)
	}
	for _, s := range servers {
		if strings.TrimSpace(s) == "" {
			return nil, fmt.Errorf("%w: empty ZooKeeper server address in %q", dlock.ErrInvalidOption, servers)
		}
	}
	servers = zk.FormatServers(servers)
	d := newDriver(o)
	d.owned = true
	d.identity = "anonymous"
	if user, _, ok := strings.Cut(o.Digest, ":"); ok {
		d.identity = "digest:" + user
	}
	conn, events, err := zk.Connect(servers, o.SessionTimeout,
		zk.WithDialer(d.dial),
		zk.WithLogger(o.Logger),
		zk.WithLogInfo(false),
		zk.WithEventCallback(d.onEvent))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", strings.Join(servers, ","), err)
	}
	d.conn, d.events = conn, events

	wctx, cancel := context.WithTimeout(ctx, o.ConnectTimeout)
	defer cancel()
	if _, err := d.sess.live(wctx, true, nil); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("no session with %s: %w", strings.Join(servers, ","), err)
	}
	if o.Digest != "" {
		_, err := call(wctx, d, func() (struct{}, error) { return struct{}{}, conn.AddAuth("digest", []byte(o.Digest)) })
		if err != nil {
			_ = d.Close()
			return nil, fmt.Errorf("digest authentication: %w", err)
		}
	}
	return d, nil
}

// NewDriver returns a driver that locks over conn, which the caller made with
// zk.Connect and keeps (Close does not close it); opts.SessionTimeout is
// required. Lock nodes live in conn's session, so one not deleted by Close
// stays until conn is closed.
// It returns once conn has a session, or fails when ctx ends or
// Options.ConnectTimeout passes first.
func NewDriver(ctx context.Context, conn *zk.Conn, opts *Options) (*Driver, error) {
	if conn == nil {
		return nil, fmt.Errorf("%w: nil ZooKeeper connection", dlock.ErrInvalidOption)
	}
	o, err := opts.withDefaults(false)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	d := newDriver(o)
	d.conn = conn
	d.observe()
	d.wg.Go(d.poll)
	wctx, cancel := context.WithTimeout(ctx, o.ConnectTimeout)
	defer cancel()
	if _, err := d.sess.live(wctx, true, nil); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("no session on the connection: %w", err)
	}
	return d, nil
}

// New returns a dlock.Locker over conn: dlock.New(NewDriver(ctx, conn, opts),
// lockerOpts...). ctx bounds NewDriver's wait for a session only. Closing the
// Locker does not close conn.
func New(ctx context.Context, conn *zk.Conn, opts *Options, lockerOpts ...dlock.Option) (dlock.Locker, error) {
	d, err := NewDriver(ctx, conn, opts)
	if err != nil {
		return nil, &dlock.Error{Op: "open", Backend: "zk", Err: err}
	}
	return dlock.New(d, lockerOpts...) // closes d if it fails
}

// open is the OpenFunc of the scheme "zk".
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	p := backend.NewParams(u)
	o := Options{
		SessionTimeout: p.Duration("session", DefaultSessionTimeout),
		ConnectTimeout: p.Duration("connect", DefaultConnectTimeout),
	}
	q := u.Query()
	for _, a := range []struct {
		name string
		acl  *[]zk.ACL
	}{{"acl", &o.ACL}, {"rootacl", &o.RootACL}} {
		if s := p.String(a.name, ""); q.Has(a.name) {
			acl, err := parseACL(s)
			if err != nil {
				return nil, fmt.Errorf("%w: parameter %s: %w", dlock.ErrInvalidOption, a.name, err)
			}
			*a.acl = acl
		}
	}
	if err := p.Done(); err != nil {
		return nil, err
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, fmt.Errorf("%w: DSN names no server (want zk://host:2181[,host:2181...]/root)", dlock.ErrInvalidOption)
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("%w: DSN has a fragment (#...)", dlock.ErrInvalidOption)
	}
	if root := strings.TrimSuffix(u.Path, "/"); root != "" {
		o.Root = root
	}
	if u.User != nil {
		pw, ok := u.User.Password()
		if u.User.Username() == "" || !ok {
			return nil, fmt.Errorf("%w: DSN user info must be user:password (digest authentication)", dlock.ErrInvalidOption)
		}
		o.Digest = u.User.Username() + ":" + pw
	}
	servers, err := backend.SplitHosts(u.Host, strconv.Itoa(DefaultPort))
	if err != nil {
		return nil, fmt.Errorf("%w: DSN: %w", dlock.ErrInvalidOption, err)
	}
	return Dial(ctx, servers, &o)
}

// onEvent receives go-zookeeper's events for a connection the driver owns. It
// runs on go-zookeeper's goroutines and must not block.
func (d *Driver) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	switch ev.State {
	case zk.StateHasSession:
		// The ConnectResponse that granted the session was read just before,
		// on this goroutine.
		h := d.lastHandshake()
		d.sess.established(h.id, h.timeout, h.sent)
	case zk.StateExpired:
		d.sess.expired()
	default:
		d.sess.disconnected()
	}
}

// poll follows the state of a connection the driver does not own.
func (d *Driver) poll() {
	t := time.NewTicker(statePoll)
	defer t.Stop()
	for {
		select {
		case <-d.quit:
			return
		case <-t.C:
			d.observe()
		}
	}
}

func (d *Driver) observe() {
	switch d.conn.State() {
	case zk.StateHasSession:
		d.sess.established(d.conn.SessionID(), d.timeout, time.Time{})
	case zk.StateExpired:
		d.sess.expired()
	default:
		d.sess.disconnected()
	}
}

// Name returns "zk".
func (d *Driver) Name() string { return "zk" }

// Conn returns the driver's ZooKeeper connection. Do not close a connection
// the driver owns (from Dial or dlock.Open); close the driver.
func (d *Driver) Conn() *zk.Conn { return d.conn }

// Root returns the node under which the driver's locks live (see LockPath).
func (d *Driver) Root() string { return d.root }

// SessionTimeout returns the timeout of the driver's current session: the
// negotiated one for a connection it dialled (before the first session, the
// one asked for), else Options.SessionTimeout.
func (d *Driver) SessionTimeout() time.Duration {
	if c := d.sess.current(); c != nil {
		return c.timeout
	}
	return d.timeout
}

// Capabilities reports strict fencing, FIFO push-based waiting, fault
// tolerance (on an ensemble), server-side expiry, loss notification, shared
// locks and counted semaphores.
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

// Close ends the driver and closes the connection if it dialled it, which
// ends the session and its lock nodes. Waiting Acquires and a second Close
// fail with ErrClosed.
func (d *Driver) Close() error {
	if d.closed.Swap(true) {
		return errClosed
	}
	if d.owned {
		d.conn.Close() // makes every call in flight return
	}
	close(d.quit)
	d.sess.close()
	if d.owned {
		// go-zookeeper closes its event channel once its goroutines are done,
		// and every call of the driver's returns once conn is closed.
		timer := time.NewTimer(closeWait)
		defer timer.Stop()
	drain:
		for {
			select {
			case _, ok := <-d.events:
				if !ok {
					break drain
				}
			case <-timer.C:
				break drain
			}
		}
		d.wg.Wait()
		return nil
	}
	// Calls on a connection the driver does not own end when it answers or
	// is closed.
	done := make(chan struct{})
	go func() {
		d.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(closeWait):
	}
	return nil
}
