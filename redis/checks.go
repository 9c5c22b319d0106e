package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// CheckMode says what the startup check does about a risky server
// configuration. See Options.Checks.
type CheckMode string

// The check modes.
const (
	// CheckWarn logs a warning for each risk and opens anyway. The default.
	CheckWarn CheckMode = "warn"
	// CheckError makes Open fail with an error matching ErrUnsafeConfig
	// when a server can evict lock or fence keys.
	CheckError CheckMode = "error"
	// CheckOff skips the check.
	CheckOff CheckMode = "off"
)

// ErrUnsafeConfig is matched by the error of Open, with Options.Checks set to
// CheckError, when a server's maxmemory-policy can evict the driver's keys.
var ErrUnsafeConfig = errors.New("redis configuration can evict locks")

// ServerConfig is what the startup check read from one master with CONFIG
// GET. In a Cluster there is one per master.
type ServerConfig struct {
	// Addr is the server's address as the client knows it, or "master"
	// for a Sentinel failover client.
	Addr string
	// Known is false when CONFIG GET failed (the command is renamed,
	// disabled, or denied by an ACL, as on many managed services); the other
	// fields are then empty and nothing was checked.
	Known bool
	// MaxMemory is maxmemory in bytes; 0 means no limit, so no eviction.
	MaxMemory int64
	// MaxMemoryPolicy is maxmemory-policy, e.g. "noeviction", "allkeys-lru".
	MaxMemoryPolicy string
	// AppendOnly is appendonly: "yes" or "no".
	AppendOnly string
	// AppendFsync is appendfsync: "always", "everysec" or "no".
	AppendFsync string
}

// Risks describes, one sentence each, what in c can break a lock or the
// fencing counter (a memory limit with a maxmemory-policy other than
// noeviction); nil if nothing.
func (c ServerConfig) Risks() []string {
	if !c.Known || c.MaxMemory == 0 || c.MaxMemoryPolicy == "noeviction" {
		return nil
	}
	what := "lock keys (they have a TTL)"
	if strings.HasPrefix(c.MaxMemoryPolicy, "allkeys-") {
		what = "lock keys and fencing counters"
	}
	return []string{fmt.Sprintf("maxmemory %d with maxmemory-policy %s can evict %s; set maxmemory-policy noeviction",
		c.MaxMemory, c.MaxMemoryPolicy, what)}
}

// Durable reports whether every write is fsynced before the reply
// (appendonly yes, appendfsync always), so a restarted server keeps its locks
// and fencing counters.
func (c ServerConfig) Durable() bool { return c.AppendOnly == "yes" && c.AppendFsync == "always" }

// CheckServer reads maxmemory, maxmemory-policy, appendonly and appendfsync
// from every master with CONFIG GET; a server where CONFIG fails is reported
// with Known false, and the error is for a deployment it cannot reach.
func (d *Driver) CheckServer(ctx context.Context) ([]ServerConfig, error) {
	if cc, ok := d.client.(*goredis.ClusterClient); ok {
		var (
			mu  sync.Mutex
			out []ServerConfig
		)
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			sc, err := readConfig(ctx, c, c.Options().Addr)
			mu.Lock()
			out = append(out, sc)
			mu.Unlock()
			return err
		})
		return out, err
	}
	addr := "master"
	if c, ok := d.client.(*goredis.Client); ok && c.Options().Addr != "FailoverClient" {
		addr = c.Options().Addr
	}
	sc, err := readConfig(ctx, d.client, addr)
	return []ServerConfig{sc}, err
}

func readConfig(ctx context.Context, c goredis.Cmdable, addr string) (ServerConfig, error) {
	sc := ServerConfig{Addr: addr}
	vals := map[string]string{}
	for _, name := range []string{"maxmemory", "maxmemory-policy", "appendonly", "appendfsync"} {
		m, err := c.ConfigGet(ctx, name).Result()
		if err != nil {
			var rerr goredis.Error
			if errors.As(err, &rerr) {
				return sc, nil // CONFIG renamed, disabled or denied: unknown
			}
			return sc, fmt.Errorf("CONFIG GET %s: %w", name, err)
		}
		vals[name] = m[name]
	}
	sc.Known = true
	sc.MaxMemory, _ = strconv.ParseInt(vals["maxmemory"], 10, 64)
	sc.MaxMemoryPolicy = vals["maxmemory-policy"]
	sc.AppendOnly = vals["appendonly"]
	sc.AppendFsync = vals["appendfsync"]
	return sc, nil
}

// startupCheck runs CheckServer and acts as d.opts.Checks says.
func (d *Driver) startupCheck(ctx context.Context) error {
	if d.opts.Checks == CheckOff {
		return nil
	}
	cfgs, err := d.CheckServer(ctx)
	if err != nil {
		return fmt.Errorf("startup check: %w", err)
	}
	log := d.opts.Logger
	var risks []string
	for _, c := range cfgs {
		if !c.Known {
			// Debug, not Info: most managed services disable CONFIG, and a line on
			// every Open would be noise. The risk is documented in docs/redis.md.
			log.DebugContext(ctx, "dlock/redis: CONFIG GET is unavailable; maxmemory-policy and persistence not checked", "addr", c.Addr)
			continue
		}
		for _, r := range c.Risks() {
			risks = append(risks, c.Addr+": "+r)
			if d.opts.Checks == CheckWarn {
				log.WarnContext(ctx, "dlock/redis: "+r, "addr", c.Addr)
			}
		}
		if !c.Durable() {
			// Debug: true of Redis's default configuration, so an Info line would
			// greet almost every Open. The restart rule is in docs/redis.md.
			log.DebugContext(ctx, "dlock/redis: the server does not fsync every write (appendonly "+c.AppendOnly+
				", appendfsync "+c.AppendFsync+"): after a crash it forgets recent locks; restart it no sooner than the longest lock TTL",
				"addr", c.Addr)
		}
	}
	if d.opts.Checks == CheckError && len(risks) > 0 {
		return fmt.Errorf("%w: %w: %s", dlock.ErrInvalidOption, ErrUnsafeConfig, strings.Join(risks, "; "))
	}
	return nil
}
