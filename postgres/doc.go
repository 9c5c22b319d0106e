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
// A lock is a session advisory lock (pg_advisory_lock_shared with
// package rwlock's readers), so raw SQL clients of the key interoperate. Free locks
// are held in one shared session per TTL; a lock that was waited for keeps
// the connection that waited. A session's idle_session_timeout is the TTL, so
// the server frees a silent holder's locks. The token is a durable per-key
// counter (default table dlock_fence; [backend.FencingStrict]). Waiting
// happens in the server, FIFO; transaction-pooling proxies are refused
// ([ErrTransactionPooling]). docs/postgres.md has the whole write-up:
// connections, keys and their SQL equivalent, shared locks, tokens, PgBouncer.
package postgres
