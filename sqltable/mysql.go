package sqltable

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"

	"github.com/go-sql-driver/mysql"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/mysqldsn"
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
	cfg, err := mysqldsn.Config(u, rest, "table, poll and max_conns")
	if err != nil {
		return nil, err
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
