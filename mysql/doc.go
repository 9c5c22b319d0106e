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
// A lock is GET_LOCK(name) on a connection pinned to the lease: the session
// holds the lock, nothing else runs on it while the lease lives, and it goes
// back to the pool when the lease is released. The name is a hash of the
// namespace and the key (see [LockName]). The session's wait_timeout is the
// TTL rounded up to a second, so the server ends the session of a silent
// holder (paused, partitioned, crashed), and with it the lock. The token is
// a per-key counter in an InnoDB table (default dlock_mysql_fence),
// incremented by the lock's session once it holds the lock, in a statement
// committed before Acquire returns: as durable as the database
// ([backend.FencingStrict]; innodb_flush_log_at_trx_commit=0 is refused with
// [ErrAsyncCommit]). Waiting happens in the server (GET_LOCK with a
// timeout); a cancelled wait is stopped with KILL QUERY from another
// connection and its connection is closed, so a grant racing the cancel dies
// with its session. For a pool it opened from a DSN, the driver reads the end
// of a lease's session off its idle connection (LossNotify, on Linux). Multi-primary clusters, where a user-level lock is local
// to one node, are refused ([ErrMultiPrimary]). docs/mysql.md in the
// repository has the whole write-up.
package mysql
