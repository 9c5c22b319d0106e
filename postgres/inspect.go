// Inspecting and breaking locks (backend.Inspector, backend.Breaker).

package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock/backend"
)

var (
	_ backend.Inspector = (*Driver)(nil)
	_ backend.Breaker   = (*Driver)(nil)
)

// inspectSQL reads, for advisory locks of the current database given by
// classid/objid/objsubid arrays, the holder's pid, application_name (the
// label), backend_start, state_change and whether its session is idle (no
// statement or transaction of its in flight: a grant it made has committed
// its token), the number of
// sessions waiting for each lock, and the number of sessions holding it
// shared (ShareLock) and exclusively (ExclusiveLock). Of several shared
// holders it reads the one whose session last changed state (PostgreSQL
// records no grant order).
const inspectSQL = `WITH k AS (
	SELECT * FROM unnest($1::oid[], $2::oid[], $3::int2[]) AS k(classid, objid, objsubid)
), l AS (
	SELECT l.* FROM pg_locks l JOIN k USING (classid, objid, objsubid)
	WHERE l.locktype = 'advisory'
	  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
), h AS (
	SELECT DISTINCT ON (l.classid, l.objid, l.objsubid) l.classid, l.objid, l.objsubid, l.pid,
		a.application_name, a.state = 'idle' AS idle, a.backend_start, a.state_change
	FROM l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
	WHERE l.granted
	ORDER BY l.classid, l.objid, l.objsubid, l.mode = 'ExclusiveLock' DESC, a.state_change DESC NULLS LAST
)
SELECT k.classid, k.objid, k.objsubid, h.pid, h.application_name, coalesce(h.idle, false), h.backend_start, h.state_change,
	(SELECT count(*) FROM l WHERE (l.classid, l.objid, l.objsubid) = (k.classid, k.objid, k.objsubid) AND NOT l.granted),
	(SELECT count(*) FROM l WHERE (l.classid, l.objid, l.objsubid) = (k.classid, k.objid, k.objsubid) AND l.granted AND l.mode = 'ShareLock'),
	(SELECT count(*) FROM l WHERE (l.classid, l.objid, l.objsubid) = (k.classid, k.objid, k.objsubid) AND l.granted AND l.mode = 'ExclusiveLock')
FROM k LEFT JOIN h USING (classid, objid, objsubid)`

// tokensSQL reads the fence table's counters of keys ($1), and then, after
// the statement's snapshot was taken, the holder of each key's advisory lock
// ($2, $3, $4: classid, objid, objsubid) in exclusive mode and its session's
// state_change, so that a holder found by inspectSQL before and here after,
// with no statement run in its session in between (the same state_change:
// its session may have served another lease since, its backend reused from
// the pool), held the lock across the read of its token. %s is the fence
// table.
const tokensSQL = `SELECT k.key, coalesce(f.token, 0), coalesce(x.pid, 0), a.state_change
FROM unnest($1::text[], $2::oid[], $3::oid[], $4::int2[]) AS k(key, classid, objid, objsubid)
LEFT JOIN %s f ON f.key = k.key
LEFT JOIN LATERAL (SELECT l.pid FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	  AND (l.classid, l.objid, l.objsubid) = (k.classid, k.objid, k.objsubid) AND l.granted
	  AND l.mode = 'ExclusiveLock' LIMIT 1) x ON true
LEFT JOIN pg_stat_activity a ON a.pid = x.pid`

// breakSharedSQL ends every session that holds an advisory lock ($1, $2,
// $3: classid, objid, objsubid) of the current database shared, waiting up
// to $4 milliseconds for each to be gone, and counts those that ended.
const breakSharedSQL = `SELECT count(*) FILTER (WHERE pg_terminate_backend(h.pid, $4)) FROM (
	SELECT DISTINCT l.pid FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	  AND l.classid = $1::int8::oid AND l.objid = $2::int8::oid AND l.objsubid = $3::int2
	  AND l.granted AND l.mode = 'ShareLock' AND l.pid IS NOT NULL
) h`

// inspectTries is how many times inspectKeys reads a lock whose holder was
// making a grant (or changed) while it looked before it reports token 0
// (cannot tell).
const inspectTries = 10

// holder is what inspectKeys found of one lock.
type holder struct {
	info    backend.LockInfo
	pid     uint32    // the holder's backend pid; 0 if not held
	started time.Time // its backend_start: with pid, names the session (pids are reused)
	changed time.Time // its state_change: when its session last ran a statement
	// settled: an exclusive holder read idle and still holding the lock
	// after its token (counter mode) or label (sequence mode) was read, so
	// info describes it (see inspectKeys).
	settled bool
}

// inspectKeys reads the locks of keys, and their tokens from the fence
// table. The two cannot be read atomically: a token is reported only if the
// holder's session was idle when its lock was read (any grant it made had
// committed) and held the lock still after its token was read; a key for
// which that does not hold is read again, up to inspectTries times in all,
// and then reported with token 0. A lock held shared is reported with token
// 0: the counter is the token of the last shared grant, whose holder may
// have left while others still hold the lock (PostgreSQL records no grant
// order), so it names no holder for sure.
func (d *Driver) inspectKeys(ctx context.Context, keys []string) ([]holder, error) {
	out := make([]holder, len(keys))
	for i, k := range keys {
		out[i].info = backend.LockInfo{Key: k}
	}
	todo := make([]int, len(keys)) // the indexes of keys still to read
	for i := range keys {
		todo[i] = i
	}
	for try := 1; len(todo) > 0; try++ {
		cls, objs, subs := make([]uint32, len(todo)), make([]uint32, len(todo)), make([]int16, len(todo))
		names := make([]string, len(todo))
		idx := map[[3]int64]int{}
		for j, i := range todo {
			cls[j], objs[j], subs[j] = d.opts.AdvisoryKey(keys[i]).PgLocks()
			names[j] = keys[i]
			idx[[3]int64{int64(cls[j]), int64(objs[j]), int64(subs[j])}] = i
		}
		idle := map[int]bool{}
		changed := map[int]time.Time{} // state_change of the holder's session
		rows, err := d.pool.Query(ctx, inspectSQL, cls, objs, subs)
		if err != nil {
			return nil, fmt.Errorf("read pg_locks: %w", err)
		}
		for rows.Next() {
			var c, o uint32
			var sub int16
			var pid *uint32
			var app *string
			var isIdle bool
			var started, stateChange *time.Time
			var waiters, shares, exclusive int64
			if err := rows.Scan(&c, &o, &sub, &pid, &app, &isIdle, &started, &stateChange, &waiters, &shares, &exclusive); err != nil {
				rows.Close()
				return nil, fmt.Errorf("read pg_locks: %w", err)
			}
			i := idx[[3]int64{int64(c), int64(o), int64(sub)}]
			out[i] = holder{info: backend.LockInfo{Key: keys[i], Waiters: int(waiters)}}
			if pid != nil {
				out[i].pid = *pid
				if started != nil {
					out[i].started = *started
				}
				out[i].info.Held = true
				if exclusive == 0 { // a session may hold both modes; then it holds it exclusively
					out[i].info.Shared = int(shares)
				}
				if app != nil {
					out[i].info.Label = *app
				}
				idle[i] = isIdle && stateChange != nil
				if stateChange != nil {
					changed[i] = *stateChange
					out[i].changed = *stateChange
				}
			}
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("read pg_locks: %w", err)
		}
		if d.opts.Tokens == TokensSequence {
			// No token is stored per key (Token 0: cannot tell), but the
			// label must still be the holder's: read again a key whose
			// holder was mid-statement (taking or giving back the lock,
			// its label set in the same statement) or no longer holds it.
			todo, err = d.unsettled(ctx, out, todo, idle, changed, cls, objs, subs, try)
			if err != nil {
				return nil, err
			}
			continue
		}
		rows, err = d.pool.Query(ctx, fmt.Sprintf(tokensSQL, d.table), names, cls, objs, subs)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", d.table, err)
		}
		type tokenRow struct {
			Key     string
			Token   int64
			Pid     uint32
			Changed *time.Time
		}
		tokens, err := pgx.CollectRows(rows, pgx.RowToStructByPos[tokenRow])
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", d.table, err)
		}
		pos := make(map[string]int, len(todo))
		for _, i := range todo {
			pos[keys[i]] = i
		}
		var again []int
		for _, t := range tokens {
			i, ok := pos[t.Key]
			if !ok || !out[i].info.Held || out[i].info.Shared > 0 {
				continue // not held, or held shared: token 0 (see above)
			}
			if idle[i] && t.Pid == out[i].pid && t.Changed != nil && t.Changed.Equal(changed[i]) {
				out[i].info.Token = uint64(t.Token)
				out[i].settled = true
			} else if try < inspectTries {
				again = append(again, i)
			}
		}
		todo = again
		if len(todo) > 0 {
			if err := backend.Sleep(ctx, time.Millisecond); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// stillHeldSQL reports, for advisory locks ($1, $2, $3: classid, objid,
// objsubid) and the sessions found holding them ($4: pid), whether each
// session holds its lock still, and its state_change.
const stillHeldSQL = `SELECT EXISTS (SELECT 1 FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	  AND (l.classid, l.objid, l.objsubid) = (k.classid, k.objid, k.objsubid) AND l.pid = k.pid AND l.granted),
	(SELECT a.state_change FROM pg_stat_activity a WHERE a.pid = k.pid)
FROM unnest($1::oid[], $2::oid[], $3::int2[], $4::int4[]) WITH ORDINALITY AS k(classid, objid, objsubid, pid, n)
ORDER BY k.n`

// unsettled returns the keys of todo (read in this try, of inspectTries)
// to read again: held by a session that was running a statement when it
// was read, or that no longer holds the lock now that its label was read,
// or has run a statement since (its state_change, in changed, moved).
// After the last try it returns none, and the keys are reported as read.
func (d *Driver) unsettled(ctx context.Context, out []holder, todo []int, idle map[int]bool, changed map[int]time.Time, cls, objs []uint32, subs []int16, try int) ([]int, error) {
	if try >= inspectTries {
		return nil, nil
	}
	pids := make([]int32, len(todo))
	for j, i := range todo {
		pids[j] = int32(out[i].pid)
	}
	rows, err := d.pool.Query(ctx, stillHeldSQL, cls, objs, subs, pids)
	if err != nil {
		return nil, fmt.Errorf("read pg_locks: %w", err)
	}
	type heldRow struct {
		Held    bool
		Changed *time.Time
	}
	held, err := pgx.CollectRows(rows, pgx.RowToStructByPos[heldRow])
	if err != nil {
		return nil, fmt.Errorf("read pg_locks: %w", err)
	}
	var again []int
	for j, i := range todo {
		switch {
		case !out[i].info.Held:
		case !idle[i] || j >= len(held) || !held[j].Held || held[j].Changed == nil || !held[j].Changed.Equal(changed[i]):
			again = append(again, i)
		case out[i].info.Shared == 0:
			out[i].settled = true
		}
	}
	if len(again) > 0 {
		if err := backend.Sleep(ctx, time.Millisecond); err != nil {
			return nil, err
		}
	}
	return again, nil
}

// Inspect implements backend.Inspector: the session holding the key's
// advisory lock in pg_locks, its application_name (the holder's label: the
// driver sets it on the session it holds the lock in), the sessions waiting
// for the lock, and the key's counter in the fence table (the holder's
// token: no grant came after it while it holds the lock). A lock lasts as
// long as its session, so Expires is zero; PostgreSQL records no grant time.
// The owner ID is not stored.
func (d *Driver) Inspect(ctx context.Context, key string) (backend.LockInfo, error) {
	hs, err := d.inspectKeys(ctx, []string{key})
	if err != nil {
		return backend.LockInfo{Key: key}, err
	}
	return hs[0].info, nil
}

// List implements backend.Inspector: the keys of the fence table that
// start with prefix (every key ever granted has a row there: pg_locks holds
// only the keys' hashes), read as Inspect reads one. With tokens=sequence no
// key is recorded, and List returns an error matching errors.ErrUnsupported.
func (d *Driver) List(ctx context.Context, prefix string) ([]backend.LockInfo, error) {
	if d.opts.Tokens == TokensSequence {
		return nil, fmt.Errorf("with tokens=%s no key is recorded (pg_locks holds only their hashes): %w", TokensSequence, errors.ErrUnsupported)
	}
	like := strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(prefix) + "%"
	rows, err := d.pool.Query(ctx, "SELECT key FROM "+d.table+" WHERE key LIKE $1 ORDER BY key", like)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", d.table, err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", d.table, err)
	}
	var infos []backend.LockInfo
	for chunk := range slices.Chunk(keys, 1000) {
		hs, err := d.inspectKeys(ctx, chunk)
		if err != nil {
			return nil, err
		}
		for _, h := range hs {
			if h.info.Held {
				infos = append(infos, h.info)
			}
		}
	}
	return infos, nil
}

// breakHook and breakCheckedHook, set by tests, are called by Break with
// the key: between its read of the holder and its check, and between its
// check of the token (the row locked) and its removal.
var breakHook, breakCheckedHook atomic.Pointer[func(key string)]

// breakWait bounds how long Break waits for a holder's session to end
// once told to.
const breakWait = 5 * time.Second

// breakReads is how many times Break reads the holder with inspectKeys
// (each up to inspectTries times) before it gives up on a holder whose
// session stays busy.
const breakReads = 3

// endHolderSQL ends the session $1 (pid), started at $2 (backend_start;
// NULL: not visible to this role), if it holds the advisory lock $3, $4, $5
// (classid, objid, objsubid) of the current database exclusively and, if $7
// is not NULL, has run no statement since $7 (its state_change), waiting up
// to $6 milliseconds for it to be gone. It returns no row if the session
// does not hold the lock (or is another session with that pid, or ran a
// statement since).
const endHolderSQL = `SELECT pg_terminate_backend($1::int4, $6::int8)
WHERE EXISTS (SELECT 1 FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	  AND l.classid = $3::int8::oid AND l.objid = $4::int8::oid AND l.objsubid = $5::int2
	  AND l.pid = $1::int4 AND l.granted AND l.mode = 'ExclusiveLock')
  AND ($2::timestamptz IS NULL OR EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = $1::int4 AND a.backend_start = $2::timestamptz))
  AND ($7::timestamptz IS NULL OR EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = $1::int4 AND a.state = 'idle' AND a.state_change = $7::timestamptz))`

// Break implements backend.Breaker: advisory locks can be released only by
// the session holding them, so it ends that session
// (pg_terminate_backend), which frees every lock the session holds: with
// dlock's driver, every lease of the holder's Locker that shares the session
// (the leases of one TTL and label that were granted without a wait), which
// end lost. It ends the session only if it still holds the key as read: the
// same session (pid and backend_start), and, in counter mode, the key's
// counter unchanged, read with its row locked (FOR SHARE) so that no grant
// of the key can commit before the session is ended; with tokens=sequence,
// no statement run in the session since the read. Otherwise it returns
// ErrNotHeld and ends nothing. A holder whose session was busy each time
// Break read it is not broken (an error; try again): Break could not tell
// which grant holds the key. A lock held shared is broken by
// ending every session that holds it shared. The fence table is untouched,
// so the next grant's token is higher. The broken holders learn it at once
// (their connections close). It needs the right to signal the holders'
// backends: the same role, or pg_signal_backend. It returns once the
// sessions have ended (at most breakWait), so the key is free when it does.
func (d *Driver) Break(ctx context.Context, key string) (backend.LockInfo, error) {
	var h holder
	for read := 1; ; read++ {
		hs, err := d.inspectKeys(ctx, []string{key})
		if err != nil {
			return backend.LockInfo{Key: key}, err
		}
		if h = hs[0]; !h.info.Held || h.info.Shared > 0 || h.settled || read == breakReads {
			break
		}
	}
	if !h.info.Held {
		return h.info, fmt.Errorf("key %q: %w", key, backend.ErrNotHeld)
	}
	if h.info.Shared == 0 && !h.settled {
		return h.info, fmt.Errorf("key %q: its holder's session was busy each time Break read it (%d reads), so Break could not tell which grant it holds; nothing was broken: try again", key, breakReads*inspectTries)
	}
	if f := breakHook.Load(); f != nil {
		(*f)(key)
	}
	if h.info.Shared > 0 {
		classid, objid, objsubid := d.opts.AdvisoryKey(key).PgLocks()
		var ended int
		if err := d.pool.QueryRow(ctx, breakSharedSQL, int64(classid), int64(objid), objsubid, breakWait.Milliseconds()).Scan(&ended); err != nil {
			return h.info, fmt.Errorf("end the shared holders' sessions: %w", err)
		}
		if ended == 0 {
			return h.info, fmt.Errorf("key %q: the shared holders' sessions ended before the break: %w", key, backend.ErrNotHeld)
		}
	} else if err := d.endHolder(ctx, key, h); err != nil {
		return h.info, err
	}
	_, _ = d.pool.Exec(ctx, notifySQL, d.opts.AdvisoryKey(key).Payload()) // best effort: followers also poll
	return h.info, nil
}

// endHolder ends the session of h, the exclusive holder of key that
// inspectKeys read, if it still holds key with the token read (see Break),
// and returns once it has ended: a TryAcquire right after finds the key
// free.
func (d *Driver) endHolder(ctx context.Context, key string, h holder) error {
	var started *time.Time
	if !h.started.IsZero() {
		started = &h.started
	}
	// With tokens=sequence no token names the grant: the session must have
	// run no statement since it was read (no release, no grant).
	var since *time.Time
	if d.opts.Tokens == TokensSequence {
		since = &h.changed
	}
	classid, objid, objsubid := d.opts.AdvisoryKey(key).PgLocks()
	var ok bool
	err := pgx.BeginTxFunc(ctx, d.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if d.opts.Tokens != TokensSequence {
			var token int64
			err := tx.QueryRow(ctx, "SELECT token FROM "+d.table+" WHERE key = $1 FOR SHARE", key).Scan(&token)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("read %s: %w", d.table, err)
			}
			if uint64(token) != h.info.Token {
				return fmt.Errorf("key %q: its holder (token %d) gave it up before the break (token %d): %w", key, h.info.Token, token, backend.ErrNotHeld)
			}
		}
		if f := breakCheckedHook.Load(); f != nil {
			(*f)(key)
		}
		err := tx.QueryRow(ctx, endHolderSQL, int32(h.pid), started, int64(classid), int64(objid), objsubid, breakWait.Milliseconds(), since).Scan(&ok)
		if errors.Is(err, pgx.ErrNoRows) && since != nil {
			return fmt.Errorf("key %q: its holder's session (pid %d) no longer holds it, or ran a statement since Break read it (with tokens=%s Break cannot tell whether it holds the same grant): %w",
				key, h.pid, TokensSequence, backend.ErrNotHeld)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("key %q: its holder's session (pid %d) no longer holds it: %w", key, h.pid, backend.ErrNotHeld)
		}
		if err != nil {
			return fmt.Errorf("end the holder's session (pid %d): %w", h.pid, err)
		}
		return nil
	})
	if err != nil || ok {
		return err
	}
	var alive bool
	if err := d.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", int32(h.pid)).Scan(&alive); err == nil && alive {
		return fmt.Errorf("key %q: the holder's session (pid %d) was told to end but had not after %v", key, h.pid, breakWait)
	}
	return fmt.Errorf("key %q: the holder's session (pid %d) ended before the break: %w", key, h.pid, backend.ErrNotHeld)
}
