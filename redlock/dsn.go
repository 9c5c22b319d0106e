package redlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/rediscore"
)

// open is the OpenFunc for the schemes "redlock" and "redlocks".
func open(ctx context.Context, u *url.URL) (backend.Driver, error) {
	p := backend.NewParams(u)
	o := Options{
		Prefix:       p.String("prefix", DefaultPrefix),
		DriftFactor:  p.Float("drift", DefaultDriftFactor, minDriftFactor, maxDriftFactor),
		NodeTimeout:  p.Duration("node_timeout", DefaultNodeTimeout),
		RetryDelay:   p.Duration("retry_delay", DefaultRetryDelay),
		PollInterval: p.Duration("poll", DefaultPollInterval),
	}
	rest := p.Rest()
	if err := p.Done(); err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	if o.Prefix == "" {
		return nil, fmt.Errorf("%w: parameter prefix is empty (omit it for the default %q)", dlock.ErrInvalidOption, DefaultPrefix)
	}
	if _, err := o.withDefaults(); err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	hosts, err := splitHosts(u.Host)
	if err != nil {
		return nil, fmt.Errorf("%w: DSN: %w", dlock.ErrInvalidOption, err)
	}

	scheme := "redis"
	if u.Scheme == "redlocks" {
		scheme = "rediss"
	}
	clients := make([]*goredis.Client, 0, len(hosts))
	closeAll := func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}
	for _, host := range hosts {
		nu := url.URL{Scheme: scheme, User: u.User, Host: host, Path: u.Path, RawQuery: rest.Encode()}
		opt, err := goredis.ParseURL(nu.String())
		if err != nil {
			closeAll()
			msg := strings.TrimPrefix(rediscore.Redact(err, u).Error(), "redis: ")
			if strings.HasPrefix(msg, "unexpected option") {
				msg += " (the driver reads drift, node_timeout, retry_delay, poll and prefix; dlock reads ttl and autorenew; go-redis reads the rest)"
			}
			return nil, fmt.Errorf("%w: DSN: %s", dlock.ErrInvalidOption, msg)
		}
		// The node timeout bounds every request through its ctx. Each
		// request is one attempt, as the algorithm has it (its retry is the
		// next round): a node that is down fails at once, with its own
		// cause, instead of using up the node timeout in go-redis's retries.
		opt.ContextTimeoutEnabled = true
		opt.DialerRetries = 1
		opt.MaxRetries = -1
		clients = append(clients, goredis.NewClient(opt))
	}
	d, err := NewDriver(ctx, clients, &o)
	if err != nil {
		closeAll()
		return nil, rediscore.Redact(err, u)
	}
	d.owned = true
	d.secret = u
	return d, nil
}

// splitHosts splits the DSN's comma-separated host list, adding the default
// port where none is given.
func splitHosts(list string) ([]string, error) {
	if list == "" {
		return nil, errors.New("no nodes (want redlock://host1:6379,host2:6379,host3:6379)")
	}
	var hosts []string
	for _, h := range strings.Split(list, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return nil, fmt.Errorf("empty host in the node list %q", list)
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			if strings.Contains(h, ":") && !strings.HasPrefix(h, "[") {
				return nil, fmt.Errorf("host %q: %w", h, err)
			}
			h = net.JoinHostPort(strings.Trim(h, "[]"), DefaultPort)
		}
		hosts = append(hosts, h)
	}
	return hosts, nil
}
