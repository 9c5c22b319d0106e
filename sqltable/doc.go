// Package sqltable is dlock's table lock: a lock is a row of a table, taken,
// renewed and released by conditional single-statement writes in autocommit,
// expired by the database server's clock, with a token incremented in the
// granting statement. It holds no session, so it works behind proxies that
// multiplex connections (PgBouncer in transaction mode, ProxySQL).
//
//	locker, err := dlock.Open(ctx, "pgtable://app@pgbouncer:6432/app?ttl=15s")
//
// Importing the package registers the schemes pgtable (PostgreSQL, through
// pgx's database/sql driver) and mysqltable (MySQL and MariaDB); NewDriver
// takes a *sql.DB of your own. Waiters poll. docs/sqltable.md has the table,
// the statements and the fault matrix.
package sqltable
