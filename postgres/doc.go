// Package postgres is dlock's driver for PostgreSQL session advisory locks,
// with a durable fence counter. Importing it registers the DSN schemes
// "postgres" and "postgresql" with dlock.Open:
//
//	import _ "github.com/dlock-go/dlock/postgres"
//
//	locker, err := dlock.Open(ctx, "postgres://app:secret@db:5432/app?ttl=15s")
//
// To lock through a *pgxpool.Pool you already have, call [New] or [NewDriver].
// It needs PostgreSQL 14 or later (for idle_session_timeout).
//
// A lock is a session advisory lock. Locks that are free when asked for are
// held in one shared session per TTL (so holding thousands takes one
// connection); a lock that had to be waited for stays on the connection that
// waited. A session's idle_session_timeout is the TTL, so the server frees
// the locks of a silent holder. The token is a per-key counter in a table (default
// dlock_fence), incremented in the statement that takes the lock and so as
// durable as the database ([backend.FencingStrict]). Waiting happens in the
// server and is cancelled with ctx; the end of the session is read off the
// idle connection at once. A shared acquire (package rwlock's readers)
// takes the same advisory lock with pg_advisory_lock_shared, so raw SQL
// clients of the key interoperate in both modes. Transaction-pooling proxies are refused
// ([ErrTransactionPooling]). docs/postgres.md in the repository has the whole
// write-up: connections, keys and their SQL equivalent, shared locks, tokens,
// PgBouncer.
package postgres
