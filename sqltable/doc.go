// Package sqltable is dlock's table lock: a lock is a row of a table, taken,
// renewed and released by conditional single-statement writes in autocommit,
// expired by the database server's clock, with a token incremented in the
// statement that grants it. It holds no session: every statement may run on
// any connection, so it works where session locks do not — behind
// PostgreSQL's PgBouncer in transaction or statement pooling mode, or any
// proxy that multiplexes connections (ProxySQL, for MySQL and MariaDB).
//
//	locker, err := dlock.Open(ctx, "pgtable://app@pgbouncer:6432/app?ttl=15s")
//
// Importing the package registers the schemes pgtable (PostgreSQL, through
// pgx's database/sql driver) and mysqltable (MySQL and MariaDB, through
// go-sql-driver/mysql). NewDriver takes a *sql.DB of your own.
//
// Waiters poll (with a jittered interval, cut short by the holder's
// remaining TTL, which every refused attempt reads): Capabilities.PushWait is
// false, and a hand-over costs up to a poll interval. Tokens are strict: the
// row's counter is incremented by the granting statement and committed with
// it. See docs/sqltable.md for the table, the statements and the fault
// matrix.
package sqltable
