// Package mysql is dlock's driver for MySQL and MariaDB user-level locks
// (GET_LOCK), with a durable fence counter. Importing it registers the DSN
// scheme "mysql" with dlock.Open:
//
//	import _ "github.com/dlock-go/dlock/mysql"
//
//	locker, err := dlock.Open(ctx, "mysql://app:secret@db:3306/app?ttl=15s")
//
// To lock through a *sql.DB you already have (go-sql-driver/mysql), call
// [New] or [NewDriver]. It needs MySQL 5.7 or later, or MariaDB 10.0 or
// later (a session may hold several user-level locks); it is tested on
// MariaDB 10.11.
//
// A lock is GET_LOCK(name) on a connection pinned to the lease (see
// [LockName]); the session's wait_timeout is the TTL, so the server ends a
// silent holder's session and with it the lock. The token is a durable
// per-key counter in an InnoDB table (default dlock_mysql_fence;
// [backend.FencingStrict]; non-durable commits are refused with
// [ErrAsyncCommit]), or with tokens=sequence ([TokensSequence]) the server's
// UUID_SHORT() under a durable epoch, with no write per grant. Waiting happens in the server, and a cancelled wait is
// stopped with KILL QUERY. Multi-primary clusters are refused
// ([ErrMultiPrimary]). docs/mysql.md has the whole write-up.
package mysql
