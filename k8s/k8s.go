package k8s

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	coordv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// Defaults for Options and the DSN parameters.
const (
	// DefaultPrefix starts the name of every Lease the driver uses. DSN: the
	// path.
	DefaultPrefix = "dlock-"

	// DefaultRequestTimeout bounds each request the driver sends. DSN
	// parameter "request-timeout".
	DefaultRequestTimeout = 5 * time.Second

	// DefaultPollInterval is the longest a waiting Acquire goes without
	// reading the Lease again when its watch reports nothing. DSN parameter
	// "poll".
	DefaultPollInterval = 5 * time.Second

	// FieldManager is the field manager of the driver's writes.
	FieldManager = "dlock"
)

// Annotations and the label the driver writes on a Lease it grants.
const (
	// AnnotationOwner holds the grant's owner ID (AcquireRequest.Owner).
	AnnotationOwner = "dlock.dev/owner"
	// AnnotationLabel holds the holder's label.
	AnnotationLabel = "dlock.dev/label"
	// AnnotationKey holds the dlock key the Lease is the lock of.
	AnnotationKey = "dlock.dev/key"
	// LabelLock is set to "true" on every Lease the driver has granted, for
	// List.
	LabelLock = "dlock.dev/lock"
)

// cancelGrace is how long a write is given to answer after the caller's ctx
// ends: its answer says whether it took the lock, which must then be given
// back.
const cancelGrace = time.Second

var errClosed = fmt.Errorf("k8s driver: %w", backend.ErrClosed)

func init() {
	backend.Register("k8s", open)
}

// Options configure a Driver. The zero value, or a nil *Options, gives the
// defaults.
type Options struct {
	// Prefix starts the name of every Lease (LeaseName). Empty means
	// DefaultPrefix ("dlock-"); use NoPrefix for none. DSN: the path.
	Prefix string

	// RequestTimeout bounds each request the driver sends (not the wait for
	// a held lock). Zero means DefaultRequestTimeout (5s); negative is an
	// error. DSN parameter "request-timeout".
	RequestTimeout time.Duration

	// PollInterval is the longest a waiting Acquire goes without reading
	// the Lease again when its watch reports nothing (jittered). Zero means
	// DefaultPollInterval (5s); negative is an error. DSN parameter "poll".
	PollInterval time.Duration
}

// NoPrefix, as Options.Prefix, names Leases by the key alone.
const NoPrefix = "-"

func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	switch r.Prefix {
	case "":
		r.Prefix = DefaultPrefix
	case NoPrefix:
		r.Prefix = ""
	default:
		if errs := validation.IsDNS1123Subdomain(r.Prefix + "x"); len(errs) > 0 {
			return r, fmt.Errorf("prefix %q: %s", r.Prefix, strings.Join(errs, "; "))
		}
		if len(r.Prefix) > 100 {
			return r, fmt.Errorf("prefix %q is longer than 100 bytes", r.Prefix)
		}
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

// Driver is the Kubernetes Lease implementation of backend.Driver. Its
// methods are safe for concurrent use. Most programs use it through
// dlock.Open or New.
type Driver struct {
	leases    coordv1.LeaseInterface
	namespace string
	prefix    string
	timeout   time.Duration
	poll      time.Duration
	client    *http.Client // closed by Close when the driver made it

	obs observations

	wmu     sync.Mutex           // guards watches
	watches map[string]*keyWatch // the waiters' shared watches, by Lease name

	bg     context.Context // cancelled by Close: ends the watches and waits
	stopBg context.CancelFunc
	wg     sync.WaitGroup // the watches' goroutines (spawn)

	mu     sync.Mutex // orders spawn and Close
	closed atomic.Bool
}

var (
	_ backend.Driver    = (*Driver)(nil)
	_ backend.Named     = (*Driver)(nil)
	_ backend.Inspector = (*Driver)(nil)
	_ backend.Breaker   = (*Driver)(nil)
	_ backend.Watcher   = (*Driver)(nil)
	_ backend.Relabeler = (*Driver)(nil)
)

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

// NewDriver returns a driver that keeps its locks as Leases in namespace
// through cs, with opts (nil for the defaults). The caller keeps cs.
func NewDriver(cs kubernetes.Interface, namespace string, opts *Options) (*Driver, error) {
	if cs == nil {
		return nil, fmt.Errorf("%w: nil kubernetes clientset", dlock.ErrInvalidOption)
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return nil, fmt.Errorf("%w: namespace %q: %s", dlock.ErrInvalidOption, namespace, strings.Join(errs, "; "))
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	bg, stop := context.WithCancel(context.Background())
	return &Driver{
		leases:    cs.CoordinationV1().Leases(namespace),
		namespace: namespace,
		prefix:    o.Prefix,
		timeout:   o.RequestTimeout,
		poll:      o.PollInterval,
		obs:       observations{m: map[string]observation{}},
		bg:        bg,
		stopBg:    stop,
	}, nil
}

// New returns a dlock.Locker over cs: dlock.New(NewDriver(cs, namespace,
// opts), lockerOpts...).
func New(cs kubernetes.Interface, namespace string, opts *Options, lockerOpts ...dlock.Option) (dlock.Locker, error) {
	d, err := NewDriver(cs, namespace, opts)
	if err != nil {
		return nil, &dlock.Error{Op: "open", Backend: "k8s", Err: err}
	}
	return dlock.New(d, lockerOpts...) // closes d if it fails
}

// Name returns "k8s".
func (d *Driver) Name() string { return "k8s" }

// Namespace returns the namespace of the driver's Leases.
func (d *Driver) Namespace() string { return d.namespace }

// LeaseName returns the name of key's Lease for this driver's prefix (see
// the package function LeaseName).
func (d *Driver) LeaseName(key string) string { return LeaseName(d.prefix, key) }

// Capabilities reports strict fencing, push-based waiting and loss
// notification, and the client's clock as the judge of expiry (a waiter
// takes over a Lease it has seen unchanged for its duration); no FIFO order,
// fault tolerance of its own, shared locks or counted semaphores.
func (d *Driver) Capabilities() backend.Capabilities {
	return backend.Capabilities{
		Fencing:       backend.FencingStrict,
		FIFO:          false,
		FaultTolerant: false,
		TimeAuthority: backend.TimeClient,
		PushWait:      true,
		LossNotify:    true,
	}
}

// Close stops the driver's watches and waits. A second Close fails with
// ErrClosed.
func (d *Driver) Close() error {
	d.mu.Lock()
	closed := d.closed.Swap(true)
	d.mu.Unlock()
	if closed {
		return errClosed
	}
	d.stopBg()
	d.wg.Wait()
	if d.client != nil {
		utilnet.CloseIdleConnectionsFor(d.client.Transport)
	}
	return nil
}

// maxNameLen is the longest Lease name (a DNS subdomain).
const maxNameLen = validation.DNS1123SubdomainMaxLength

// LeaseName returns the name of the Lease of key under prefix: prefix, then
// the key with ASCII lower-case letters and digits kept and every other
// byte written as "-" and two lower-case hex digits (with prefix "dlock-",
// "jobs/Nightly" is "dlock-jobs-2f-4eightly"), so that distinct keys get
// distinct names. A name longer than 253 bytes is cut
// and ends with "-h" and the first 40 hex digits of the key's SHA-256.
func LeaseName(prefix, key string) string {
	var b strings.Builder
	b.Grow(len(prefix) + len(key))
	b.WriteString(prefix)
	const hexd = "0123456789abcdef"
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('-')
		b.WriteByte(hexd[c>>4])
		b.WriteByte(hexd[c&15])
	}
	name := b.String()
	if len(name) <= maxNameLen {
		return name
	}
	sum := sha256.Sum256([]byte(key))
	suffix := "-h" + hex.EncodeToString(sum[:20])
	cut := maxNameLen - len(suffix)
	// Never end in the middle of an escape: it would end with '-'.
	for i := cut - 1; i >= cut-2 && i >= len(prefix); i-- {
		if name[i] == '-' {
			cut = i
		}
	}
	return name[:cut] + suffix
}

// checkName reports a Lease name the API server would refuse: a key that
// starts with an escaped byte under an empty prefix.
func checkName(name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("%w: Lease name %q: %s (use a prefix)", backend.ErrInvalidOption, name, strings.Join(errs, "; "))
	}
	return nil
}

// open is the OpenFunc for the scheme "k8s".
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	p := backend.NewParams(u)
	kubeconfig := p.String("kubeconfig", "")
	kubecontext := p.String("context", "")
	o := Options{
		RequestTimeout: p.Duration("request-timeout", DefaultRequestTimeout),
		PollInterval:   p.Duration("poll", DefaultPollInterval),
	}
	if err := p.Done(); err != nil {
		return nil, err
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: DSN has user information; credentials come from the kubeconfig or the pod's service account", dlock.ErrInvalidOption)
	}
	if u.Opaque != "" || u.Fragment != "" || u.Port() != "" {
		return nil, fmt.Errorf("%w: DSN must look like k8s://namespace/prefix?kubeconfig=PATH", dlock.ErrInvalidOption)
	}
	namespace := u.Hostname()
	if path := strings.Trim(u.Path, "/"); path != "" {
		if strings.Contains(path, "/") {
			return nil, fmt.Errorf("%w: DSN path must be one Lease name prefix", dlock.ErrInvalidOption)
		}
		o.Prefix = path
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubecontext})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", scrub(err, cfg))
	}
	if namespace == "" {
		return nil, fmt.Errorf("%w: DSN has no namespace (k8s://namespace/…)", dlock.ErrInvalidOption)
	}
	return newFromConfig(ctx, cfg, namespace, &o)
}

// newFromConfig makes the driver's own HTTP client from cfg, so that Close
// can close its idle connections.
func newFromConfig(_ context.Context, cfg *rest.Config, namespace string, o *Options) (backend.Driver, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "dlock"
	if cfg.Proxy == nil {
		// A transport of the driver's own, not client-go's shared one, so
		// that Close ends its connections.
		cfg.Proxy = http.ProxyFromEnvironment
	}
	if cfg.QPS == 0 && cfg.RateLimiter == nil {
		// No client-side limit (client-go's default is 5 requests a
		// second): the API server's priority and fairness is the limit.
		cfg.QPS = -1
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", scrub(err, cfg))
	}
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", scrub(err, cfg))
	}
	d, err := NewDriver(cs, namespace, o)
	if err != nil {
		utilnet.CloseIdleConnectionsFor(hc.Transport)
		return nil, err
	}
	d.client = hc
	return d, nil
}

// scrub removes cfg's credentials from err's text.
func scrub(err error, cfg *rest.Config) error {
	if err == nil || cfg == nil {
		return err
	}
	var secrets []string
	for _, s := range []string{cfg.BearerToken, cfg.Password} {
		if s != "" {
			secrets = append(secrets, s)
		}
	}
	msg := err.Error()
	changed := false
	for _, s := range secrets {
		if strings.Contains(msg, s) {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
			changed = true
		}
	}
	if !changed {
		return err
	}
	return &scrubbed{msg: msg, err: err}
}

type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }
