package redlock

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
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
		return nil, err
	}
	if o.Prefix == "" {
		return nil, fmt.Errorf("%w: parameter prefix is empty (omit it for the default %q)", dlock.ErrInvalidOption, DefaultPrefix)
	}
	if _, err := o.withDefaults(); err != nil {
		return nil, fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%w: DSN: no nodes (want redlock://host1:6379,host2:6379,host3:6379)", dlock.ErrInvalidOption)
	}
	hosts, err := backend.SplitHosts(u.Host, DefaultPort)
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
			msg := strings.TrimPrefix(backend.RedactError(err, u).Error(), "redis: ")
			if strings.HasPrefix(msg, "unexpected option") {
				msg += " (the driver reads drift, node_timeout, retry_delay, poll and prefix; dlock reads ttl, autorenew, label and reentrant; go-redis reads the rest)"
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
		return nil, backend.RedactError(err, u)
	}
	d.owned = true
	d.secret = u
	return d, nil
}
