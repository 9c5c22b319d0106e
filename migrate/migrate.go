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
// [DSN] builds such a DSN; dlock's own parameters (ttl, autorenew, label,
// reentrant) go on the migrate:// DSN itself. The new backend must be etcd or
// ZooKeeper. The rollout: deploy mode "migrate" everywhere, run [Switch]
// (`dlock migrate switch-tokens`) once no old-only process is left, then
// deploy mode "new" and stay on it; after the switch a token is base(key) +
// the new lock's token. docs/MIGRATING.md has the steps, the token
// mapping, the invariants and what is refused.
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
// (ModeMigrate or ModeNew; "" means ModeMigrate). from may be "" with
// ModeNew, which then does not check the switch record's old backend.
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

// BackendID names the backend of a DSN for the switch record: its scheme,
// sorted hosts with default ports, path and "prefix" parameter, so that two
// DSNs of one deployment written differently match.
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
