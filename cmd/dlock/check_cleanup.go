package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// dropCheckTables drops the check's own PostgreSQL fence table and the
// sequence mode's tables and sequences beside it ("_epoch", "_live",
// "_seq", "_mark"), connecting with the user's DSN.
func dropCheckTables(ctx context.Context, dsn, table string) error {
	u, err := backend.ParseDSN(dsn)
	if err != nil {
		return err
	}
	q := u.Query()
	// The parameters of dlock and of the driver are not pgx's.
	for _, p := range []string{"ttl", "autorenew", "label", "reentrant", "namespace", "classid", "table", "tokens"} {
		q.Del(p)
	}
	u.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return backend.RedactError(err, u)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return backend.RedactError(err, u)
	}
	defer conn.Close(context.Background())
	ident := func(suffix string) string {
		parts := strings.Split(table, ".")
		parts[len(parts)-1] += suffix
		return pgx.Identifier(parts).Sanitize()
	}
	for _, stmt := range []string{
		"SET lock_timeout = '10s'",
		"DROP TABLE IF EXISTS " + ident("") + ", " + ident("_epoch") + ", " + ident("_live"),
		"DROP SEQUENCE IF EXISTS " + ident("_seq") + ", " + ident("_mark"),
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", strings.Fields(stmt)[0]+" "+strings.Fields(stmt)[1], err)
		}
	}
	return nil
}

// breakLeftovers breaks every lock held under the check's own namespace of
// dsn (an etcd prefix of the run's own), as after a suite that was stopped,
// and returns how many it broke.
func breakLeftovers(ctx context.Context, dsn string) (int, error) {
	l, err := openLocker(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer l.Close()
	infos, err := dlock.List(ctx, l, "")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, info := range infos {
		switch _, err := dlock.Break(ctx, l, info.Key); {
		case err == nil:
			n++
		case errors.Is(err, dlock.ErrNotHeld):
		default:
			return n, err
		}
	}
	return n, nil
}

// privilegeFor names what making the server of scheme forget a holder (with
// dlock.Break) needs.
func privilegeFor(scheme string) string {
	switch scheme {
	case "postgres", "postgresql":
		return "the right to end the holder's session (pg_terminate_backend): the lockers' own role, pg_signal_backend or a superuser"
	case "etcd", "etcds":
		return "the right to delete the lock's keys: etcd root, auth disabled, or a read-write role on the prefix"
	case "zk":
		return "the DELETE permission on the lock's nodes: the DSN's digest credentials, or an ACL that grants it"
	case "mysql":
		return "the right to KILL the holder's connection: the same user, or CONNECTION_ADMIN"
	}
	return "administrative access to the " + scheme + " server"
}

// isPrivilegeError reports whether err says the credentials lack a
// privilege: PostgreSQL's insufficient_privilege, etcd's and MySQL's
// "permission denied" and "access denied", ZooKeeper's NOAUTH.
func isPrivilegeError(err error) bool {
	s := strings.ToLower(err.Error())
	for _, m := range []string{"permission denied", "access denied", "not authenticated", "insufficient privilege", "sqlstate 42501", "not owner of thread"} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// forgetByBreak makes the backend forget key's holder behind its back with
// dlock.Break, through l. It returns errors.ErrUnsupported if the backend
// cannot break locks.
func forgetByBreak(ctx context.Context, l dlock.Locker, key string) error {
	var err error
	for range 5 {
		if _, err = dlock.Break(ctx, l, key); err == nil || errors.Is(err, errors.ErrUnsupported) ||
			errors.Is(err, dlock.ErrNotHeld) || isPrivilegeError(err) || ctx.Err() != nil {
			return err
		}
		// PostgreSQL: the holder's session was busy when read; read again.
	}
	return err
}
