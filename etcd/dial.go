package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// Dial connects to the etcd cluster of an etcd:// or etcds:// DSN, checking
// within ctx that it answers, and returns the client, which the caller closes,
// and the DSN's lock prefix. It is for programs that keep records next to the
// locks, such as package migrate; dlock's own parameters (ttl, autorenew,
// label, reentrant) are ignored.
func Dial(ctx context.Context, dsn string) (cli *clientv3.Client, prefix string, err error) {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	if u.Scheme != "etcd" && u.Scheme != "etcds" {
		return nil, "", fmt.Errorf("%w: scheme %q is not etcd or etcds", dlock.ErrInvalidOption, u.Scheme)
	}
	cfg, o, err := parseDSN(backend.WithoutPortable(u))
	if err != nil {
		return nil, "", invalid(err)
	}
	if o, err = o.withDefaults(); err != nil {
		return nil, "", invalid(err)
	}
	cli, err = clientv3.New(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("connect to %s: %w", strings.Join(cfg.Endpoints, ","), backend.RedactError(err, u))
	}
	cctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := cli.Get(cctx, o.Prefix, clientv3.WithCountOnly()); err != nil {
		_ = cli.Close()
		return nil, "", fmt.Errorf("etcd at %s: %w", strings.Join(cfg.Endpoints, ","), backend.RedactError(err, u))
	}
	return cli, o.Prefix, nil
}

// invalid wraps err in dlock.ErrInvalidOption unless it already is one.
func invalid(err error) error {
	if errors.Is(err, dlock.ErrInvalidOption) {
		return err
	}
	return fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
}
