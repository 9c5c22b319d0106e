package redis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// Default ports for hosts given without one in a DSN.
const (
	defaultRedisPort    = "6379"
	defaultSentinelPort = "26379"
)

// newClient builds the go-redis client a DSN names, with
// ContextTimeoutEnabled set, and says what it connects to for messages (no
// password). rest are the query parameters the driver did not read; go-redis
// validates them.
func newClient(u *url.URL, rest url.Values) (goredis.UniversalClient, string, error) {
	base, topology, _ := strings.Cut(u.Scheme, "+")
	switch topology {
	case "":
		cu := *u
		cu.RawQuery = rest.Encode()
		opt, err := goredis.ParseURL(cu.String())
		if err != nil {
			return nil, "", err
		}
		opt.ContextTimeoutEnabled = true
		return goredis.NewClient(opt), opt.Addr, nil

	case "sentinel":
		hosts, err := backend.SplitHosts(u.Host, defaultSentinelPort)
		if err != nil {
			return nil, "", err
		}
		master, db, _ := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
		if master == "" {
			return nil, "", errors.New("no master name (want redis+sentinel://host1:26379,host2:26379/mymaster[/db])")
		}
		q := cloneValues(rest)
		q.Set("master_name", master)
		for _, h := range hosts[1:] {
			q.Add("addr", h)
		}
		if db != "" {
			q.Set("db", db)
		}
		// ParseFailoverURL takes the URL's user info for the sentinels;
		// dlock's DSN gives it to the master and replicas.
		if u.User != nil {
			q.Set("username", u.User.Username())
			if pw, ok := u.User.Password(); ok {
				q.Set("password", pw)
			}
		}
		fu := url.URL{Scheme: base, Host: hosts[0], RawQuery: q.Encode()}
		opt, err := goredis.ParseFailoverURL(fu.String())
		if err != nil {
			return nil, "", err
		}
		opt.ContextTimeoutEnabled = true
		return goredis.NewFailoverClient(opt), fmt.Sprintf("master %q via sentinels %s", master, strings.Join(hosts, ",")), nil

	case "cluster":
		hosts, err := backend.SplitHosts(u.Host, defaultRedisPort)
		if err != nil {
			return nil, "", err
		}
		if u.Path != "" && u.Path != "/" {
			return nil, "", fmt.Errorf("invalid URL path %q: Redis Cluster has no databases", u.Path)
		}
		q := cloneValues(rest)
		for _, h := range hosts[1:] {
			q.Add("addr", h)
		}
		cu := url.URL{Scheme: base, User: u.User, Host: hosts[0], RawQuery: q.Encode()}
		opt, err := goredis.ParseClusterURL(cu.String())
		if err != nil {
			return nil, "", err
		}
		opt.ContextTimeoutEnabled = true
		return goredis.NewClusterClient(opt), "cluster " + strings.Join(hosts, ","), nil
	}
	return nil, "", fmt.Errorf("unknown scheme %q", u.Scheme)
}

func cloneValues(v url.Values) url.Values {
	c := url.Values{}
	for k, vs := range v {
		c[k] = append([]string(nil), vs...)
	}
	return c
}

// OpenUniversal returns a Locker over goredis.NewUniversalClient(uo), which
// it owns, with ContextTimeoutEnabled set; like Open it pings the deployment
// within ctx and runs the startup check of opts.Checks. opts may be nil.
func OpenUniversal(ctx context.Context, uo *goredis.UniversalOptions, opts *Options, lockerOpts ...dlock.Option) (dlock.Locker, error) {
	if uo == nil {
		return nil, &dlock.Error{Op: "open", Backend: "redis", Err: fmt.Errorf("%w: nil UniversalOptions", dlock.ErrInvalidOption)}
	}
	if _, err := opts.withDefaults(); err != nil {
		return nil, &dlock.Error{Op: "open", Backend: "redis", Err: fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)}
	}
	c := *uo
	c.ContextTimeoutEnabled = true
	d, err := startOwned(ctx, goredis.NewUniversalClient(&c), opts, strings.Join(c.Addrs, ","))
	if err != nil {
		return nil, &dlock.Error{Op: "open", Backend: "redis", Err: err}
	}
	return dlock.New(d, lockerOpts...) // closes d if it fails
}
