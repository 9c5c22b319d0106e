package sqltable

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

func init() {
	backend.Register("mysqltable", openMySQL)
}

// openMySQL is the OpenFunc of the scheme mysqltable: a URL
// mysqltable://user:password@host:3306/db?… with dlock's parameters (ttl,
// …) and this driver's (table, poll, max_conns); the others are
// go-sql-driver/mysql's (tls, timeout, …); any other is refused. Unless
// the DSN says otherwise, the client interpolates arguments
// (interpolateParams=true: no server-side prepared statement, one round
// trip per statement, and nothing that a multiplexing proxy must follow
// across connections) and parses times (parseTime=true).
func openMySQL(ctx context.Context, u *url.URL) (backend.Driver, error) {
	o, maxConns, rest, err := parseParams(u)
	if err != nil {
		return nil, err
	}
	for name, def := range map[string]string{"interpolateParams": "true", "parseTime": "true"} {
		if !rest.Has(name) {
			rest.Set(name, def)
		}
	}
	host := u.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "3306")
	}
	base := mysql.NewConfig()
	base.Net, base.Addr, base.DBName = "tcp", host, strings.TrimPrefix(u.Path, "/")
	if u.User != nil {
		base.User = u.User.Username()
		base.Passwd, _ = u.User.Password()
	}
	cfg, err := mysql.ParseDSN(base.FormatDSN() + "?" + rest.Encode())
	if err != nil {
		return nil, fmt.Errorf("%w: DSN: %w", dlock.ErrInvalidOption, backend.RedactError(err, u))
	}
	if len(cfg.Params) > 0 {
		// go-sql-driver/mysql would SET them as system variables after
		// logging in: refuse them here, where a typo is caught before any
		// connection (build a *sql.DB of your own to set variables).
		names := make([]string, 0, len(cfg.Params))
		for name := range cfg.Params {
			names = append(names, name)
		}
		slices.Sort(names)
		return nil, fmt.Errorf("%w: unknown DSN parameter(s) %s (the driver reads table, poll and max_conns; dlock reads ttl and autorenew; "+
			"the rest must be go-sql-driver/mysql's)", dlock.ErrInvalidOption, strings.Join(names, ", "))
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: DSN: %w", dlock.ErrInvalidOption, backend.RedactError(err, u))
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	d, err := newDriver(ctx, db, MySQL, &o, true)
	if err != nil {
		_ = db.Close()
		return nil, backend.RedactError(err, u)
	}
	return d, nil
}
