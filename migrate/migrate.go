// Package migrate moves a running fleet from one lock backend to another —
// Redis to etcd, typically — with configuration changes only, and with the
// fencing tokens every resource sees for a key never going backwards.
//
// Importing it registers the DSN scheme "migrate" (and, through their
// packages, the redis, etcd and zk schemes), so code that already calls
// dlock.Open(ctx, os.Getenv("LOCK_DSN")) migrates when LOCK_DSN changes:
//
//	migrate://?from=<old DSN, URL-escaped>&to=<new DSN, URL-escaped>           both locks (mode "migrate", the default)
//	migrate://?from=<old DSN, URL-escaped>&to=<new DSN, URL-escaped>&mode=new  the new lock only
//
// [DSN] builds such a DSN, escaping the inner ones. The parameters "ttl" and
// "autorenew" go on the migrate:// DSN itself and apply to both locks; the
// inner DSNs must not carry them. The new backend must be etcd (etcd:// or
// etcds://) or ZooKeeper (zk://): the switch record and the per-key bases
// live there.
//
// # The rollout
//
//  1. Deploy the migrating Locker (mode "migrate") everywhere, one process at a
//     time. It takes the old lock, then the new one (one fixed order, so
//     migrating clients never deadlock each other), and holds both. Old-only and
//     migrating processes exclude each other through the old lock, and tokens
//     are still the old backend's.
//  2. Once no old-only process is left, run the one switch command,
//     `dlock migrate switch-tokens --from OLD --to NEW` (or [Switch]). It
//     records in the new backend a base above every token the old backend has
//     given. From then on every grant takes its token from the new backend,
//     mapped above the old tokens (see Tokens below). Nothing is redeployed.
//  3. Deploy mode "new" everywhere, one process at a time. Migrating and
//     new-only processes exclude each other through the new lock, and both map
//     tokens the same way. Once every process runs mode "new", the old backend
//     is no longer used.
//
// Stay on the migrate:// DSN with mode "new" for good: a plain etcd:// DSN
// hands out unmapped tokens, which resources that saw old tokens reject.
//
// # Tokens
//
// Before the switch a migrating grant's token is the old lock's. Each
// migrating grant reads the switch record while it holds both locks, so the
// switch takes effect at one point in each key's grant order, and every later
// grant, in every process, sees it (etcd reads are linearizable; ZooKeeper
// reads follow a sync).
//
// After the switch a grant's token is base(key) + the new lock's token (the
// etcd create revision, the ZooKeeper czxid). base(key) starts at the switch record's base: the old
// backend's token on a probe key (for Redis, at least the server's clock in
// µs, since the Redis driver floors its tokens at TIME) plus a margin (default
// 24h in µs). Every token Redis gave before the switch is below it, as long as
// the Redis clock did not step back by more than the margin. A migrating grant
// also knows the old lock's current token, which is above every earlier old
// token of that key whatever the clocks did; if it is not below base(key), the
// grant raises base(key) to it and records that in the new backend, under
// both locks, by compare-and-swap. Bases only rise and create revisions only
// rise, so mapped tokens strictly increase; and a new-only client, which never
// talks to the old backend, reads the same record and maps the same way.
//
// # Refusals
//
// A new-only Locker refuses to open, and refuses every grant, before the switch
// ([ErrNotSwitched]). A Locker whose old backend is not the one the switch
// record names refuses too ([ErrMismatch]). A grant whose mapped token would
// not be above the old lock's token, or would overflow, is released and
// refused ([ErrTokenBackwards]).
//
// # What the composite lease is
//
// A migrating lease holds both locks; it is lost when either is (Done closes,
// Err matches dlock.ErrLeaseLost), and its Capabilities are the weaker of the
// two backends' in every respect. Releasing it releases the new lock, then the
// old. Each inner lock is renewed by its own Locker's keepalive; a Refresh of
// the composite lease refreshes both.
package migrate

import (
	"errors"
	"net/url"
	"slices"
	"strings"

	"github.com/dlock-go/dlock/backend"
)

// Scheme is the DSN scheme this package registers.
const Scheme = "migrate"

// Modes, the values of the DSN parameter "mode".
const (
	// ModeMigrate holds the old lock and the new lock. The default.
	ModeMigrate = "migrate"

	// ModeNew holds the new lock only, and refuses to run before the switch.
	ModeNew = "new"
)

// Errors of this package; match them with errors.Is.
var (
	// ErrNotSwitched is returned by a new-only Locker (and Open) before the
	// switch has been recorded, and by ReadSwitch when there is no record.
	ErrNotSwitched = errors.New("tokens not switched yet: run `dlock migrate switch-tokens` once no old-only client is left")

	// ErrMismatch is returned when the switch record in the new backend names
	// another old backend than this Locker's, or a record is unreadable.
	ErrMismatch = errors.New("switch record does not match")

	// ErrTokenBackwards is returned instead of a grant whose token would not
	// be above every token the key has had.
	ErrTokenBackwards = errors.New("token would go backwards")
)

// DSN returns the migrate:// DSN for the old and new DSNs and a mode
// (ModeMigrate or ModeNew; "" means ModeMigrate, which the DSN then leaves
// out). from may be "" with ModeNew; then the switch record's old backend is
// not checked.
func DSN(from, to, mode string) string {
	var parts []string
	if from != "" {
		parts = append(parts, "from="+url.QueryEscape(from))
	}
	parts = append(parts, "to="+url.QueryEscape(to))
	if mode != "" && mode != ModeMigrate {
		parts = append(parts, "mode="+url.QueryEscape(mode))
	}
	return Scheme + "://?" + strings.Join(parts, "&")
}

// defaultPorts are the ports a DSN host without one gets, per scheme, for
// BackendID.
var defaultPorts = map[string]string{
	"redis": "6379", "rediss": "6379", "redis+sentinel": "26379", "rediss+sentinel": "26379",
	"redis+cluster": "6379", "rediss+cluster": "6379", "redlock": "6379", "redlocks": "6379",
	"etcd": "2379", "etcds": "2379", "zk": "2181", "postgres": "5432", "postgresql": "5432",
}

// BackendID names the backend of a DSN for the switch record: the scheme, the
// hosts (sorted, lower-cased, with the scheme's default port), the path
// (database or prefix; "/0" for a Redis DSN without one) and the "prefix"
// parameter if given. User names, passwords and other parameters are left
// out, so two DSNs of the same deployment written differently still match.
func BackendID(dsn string) (string, error) {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return "", err
	}
	return backendID(u), nil
}

func backendID(u *url.URL) string {
	hosts := []string{strings.ToLower(u.Host)}
	if port, ok := defaultPorts[u.Scheme]; ok && u.Host != "" {
		if hs, err := backend.SplitHosts(strings.ToLower(u.Host), port); err == nil {
			hosts = hs
		}
	}
	slices.Sort(hosts)
	path := strings.TrimRight(u.Path, "/")
	if path == "" && strings.HasPrefix(u.Scheme, "redis") && !strings.Contains(u.Scheme, "cluster") {
		path = "/0"
	}
	id := strings.ToLower(u.Scheme) + "://" + strings.Join(hosts, ",") + path
	if u.Opaque != "" {
		id = strings.ToLower(u.Scheme) + ":" + u.Opaque
	}
	if p := u.Query().Get("prefix"); p != "" {
		id += "?prefix=" + url.QueryEscape(p)
	}
	return id
}
