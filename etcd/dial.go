package etcd

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// Dial connects to the etcd cluster of a DSN in the forms the driver's Open
// accepts (etcd:// or etcds://, the same parameters; "ttl" and "autorenew"
// are accepted and ignored) and returns the client together with the DSN's
// lock prefix (DefaultPrefix if the DSN has no path). It is for programs that
// keep records of their own next to the locks, such as package migrate.
//
// ctx bounds the check that the cluster answers. The caller owns the client
// and must close it. Errors never contain the DSN's password.
func Dial(ctx context.Context, dsn string) (cli *clientv3.Client, prefix string, err error) {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	if u.Scheme != "etcd" && u.Scheme != "etcds" {
		return nil, "", fmt.Errorf("%w: scheme %q is not etcd or etcds", dlock.ErrInvalidOption, u.Scheme)
	}
	cfg, o, err := parseDSN(u)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
	}
	if o, err = o.withDefaults(); err != nil {
		return nil, "", fmt.Errorf("%w: %w", dlock.ErrInvalidOption, err)
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
