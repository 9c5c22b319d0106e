// Package mysqldsn turns the URL form of a dlock DSN for MySQL or MariaDB
// (scheme://user:password@host:3306/db?…) into go-sql-driver/mysql's
// Config. It is shared by the drivers of the schemes mysql and mysqltable.
package mysqldsn

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// Config returns the client configuration of u, whose dlock and driver
// parameters have been read already: rest holds the others, which must be
// go-sql-driver/mysql's (tls, timeout, readTimeout, …); any other is refused
// with an error naming it, which says that the driver's own parameters are
// ours (e.g. "table, poll and max_conns"). Unless rest says otherwise, the
// client interpolates arguments (interpolateParams=true: no server-side
// prepared statement, one round trip per statement) and parses times
// (parseTime=true). The port defaults to 3306. Errors never show the
// password.
func Config(u *url.URL, rest url.Values, ours string) (*mysql.Config, error) {
	rest = maps(rest)
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
		return nil, fmt.Errorf("%w: unknown DSN parameter(s) %s (the driver reads %s; dlock reads ttl, autorenew, label and reentrant; "+
			"the rest must be go-sql-driver/mysql's)", dlock.ErrInvalidOption, strings.Join(names, ", "), ours)
	}
	return cfg, nil
}

// maps copies v, so the caller's values are left as they were.
func maps(v url.Values) url.Values {
	c := make(url.Values, len(v)+2)
	for k, vs := range v {
		c[k] = slices.Clone(vs)
	}
	return c
}
