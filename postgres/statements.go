package postgres

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// statements are the SQL the driver runs, built once per driver for its fence
// table, its advisory key form, and whether it owns the pool's sessions.
// Lock arguments come first ($1, or $1 and $2 for the two-int4 form).
//
// The acquire must run in READ COMMITTED (so that the counter update sees the
// previous holder's committed increment even though the statement's snapshot
// predates the lock wait), with no lock_timeout or statement_timeout (ctx
// bounds the wait), and commit durably (synchronous_commit at least local). A
// driver that owns its pool sets those once per connection (sessionDefaults,
// run by AfterConnect) and acquires with one statement; a driver over a
// caller's pool cannot know the sessions' defaults, and wraps the statement
// in a transaction that sets them (begin, setup, commit) — in the same round
// trip.
type statements struct {
	owned bool

	// begin, setup and commit bracket the acquire on a caller's pool. setup
	// sets, for the transaction only: the settings above, and an idle timeout
	// inside the transaction equal to the TTL (argument: milliseconds, text).
	begin, setup, commit string

	// exclusive and share are the statements that name the lock's mode:
	// pg_advisory_lock and its relatives for an exclusive lock,
	// pg_advisory_lock_shared and its relatives for a shared one
	// (AcquireRequest.Shared). See mode.
	exclusive, share lockStatements

	// ping resets the session's idle timer (and sets its timeout for the
	// TTL), and reports the backend pid and whether the session holds the
	// lock in the lease's mode. Arguments: the TTL in milliseconds as text,
	// classid, objid, objsubid, the pg_locks mode (lockStatements.mode).
	ping string

	// relabel sets the session's application_name (the holders' label), and
	// reports the backend pid and whether the session holds the lock in the
	// lease's mode. Arguments: the label, classid, objid, objsubid, the
	// pg_locks mode.
	relabel string

	// reset restores, on a caller's pool, what a lease changed in its own
	// session (RESET), after lockStatements.unlock.
	reset string

	// sharedPing resets a shared session's idle timer (argument: the TTL in
	// milliseconds, as text) and returns its pid. sharedReset restores a
	// shared session's idle timeout before it goes back to the pool.
	sharedPing, sharedReset string

	// rollback ends a cancelled acquire, before lockStatements.cleanup.
	rollback string
	// newEpoch is sequence mode's token statement for a server that lost its
	// marker (see sequenceTokens); empty in counter mode.
	newEpoch string
	// setMark copies an epoch (argument) into sequence mode's marker
	// sequence, after newEpoch committed it; empty without the sequence
	// (see sequenceTokens).
	setMark string
}

// lockStatements are the statements of one lock mode. Both modes lock the
// same advisory key, so that they exclude each other as PostgreSQL's own
// functions do: pg_advisory_lock(k) and pg_advisory_lock_shared(k).
type lockStatements struct {
	// tryLock and lock take the lock and, only if it was granted, increment
	// the key's counter and set the session's idle_session_timeout (which
	// frees the lock of a silent client) to the TTL and its application_name
	// to the holder's label (what Inspect reports), in one statement; they
	// return the token and the session's backend pid, or no row if the lock
	// was not granted (the session is then as it was). Arguments: the lock
	// arguments, the key, the TTL in milliseconds as text, the label. A
	// shared grant takes its token from the same counter as an exclusive
	// one, with the same statement.
	tryLock, lock string

	// tryLockSet is tryLock for a shared session whose idle_session_timeout
	// and application_name are the lease's already (every lease of a shared
	// session has its TTL and its label, and the session's first grant set
	// them): it sets neither, and takes the same arguments and returns the
	// same columns. Two set_config calls cost about as much, server side, as
	// the rest of a sequence-mode grant.
	tryLockSet string

	// next, in sequence mode only (empty in counter mode), takes tryLockSet's
	// place: a later grant of a shared session, in the smallest statement
	// that draws a token. Arguments: the lock arguments only. It always
	// returns one row: the sequence's next value (NULL if the lock was not
	// granted) and the session's backend pid. The token is that value in the
	// epoch of the session's first grant (shared.epoch), which every later
	// grant of the session would read: the epoch in use changes only when
	// crash recovery or a promotion empties the marker, which ends every
	// session (a standby's sessions draw no token: nextval fails there), and
	// within one server's life nextval never goes back. Measured against
	// tryLockSet (interleaved on one server, ratios of the uncontended
	// cycle of pg_try_advisory_lock/unlock): a CASE in place of the CTE, and
	// no unused parameters or columns, +5%; no marker read, +2%.
	next string

	// unlock releases the lock of a lease with a session of its own,
	// returning the backend pid and whether the lock was held; on an owned
	// pool it also restores the session's idle timeout (0), on a caller's
	// pool statements.reset does (RESET).
	unlock string

	// sharedUnlock releases a lock of a shared session, whose idle timeout
	// stays (other leases depend on it), returning the backend pid and
	// whether the lock was held.
	sharedUnlock string

	// cleanup releases the lock after a cancelled or failed acquire, in case
	// it was granted.
	cleanup string

	// mode is the lock's mode in pg_locks: "ExclusiveLock" or "ShareLock".
	mode string
}

// mode returns the statements of a lock held shared (share) or
// exclusively.
func (s *statements) mode(share bool) *lockStatements {
	if share {
		return &s.share
	}
	return &s.exclusive
}

// sessionDefaults is what AfterConnect runs on every connection of a pool the
// driver owns. The idle timeout is 0 between leases, whatever the server's
// default: a lease sets its own. synchronous_commit is raised from off to
// local, for counter mode's grants, whose commits must be durable; in
// sequence mode (sequence), whose grants need not be, it is set off, and the
// one statement that must be durable (newEpoch) raises it for its own
// transaction. It also reads the session's application_name as it started,
// which the driver keeps with the connection (appNameData) and restores
// when a lease's label leaves it.
func sessionDefaults(sequence bool) string {
	commit := "CASE WHEN current_setting('synchronous_commit') = 'off' THEN set_config('synchronous_commit', 'local', false) END"
	if sequence {
		commit = "set_config('synchronous_commit', 'off', false)"
	}
	return `SELECT set_config('default_transaction_isolation', 'read committed', false),
	set_config('lock_timeout', '0', false),
	set_config('statement_timeout', '0', false),
	set_config('idle_session_timeout', '0', false),
	` + commit + `,
	current_setting('application_name')`
}

// durableCommit is, in SQL, the synchronous_commit a commit that must be
// durable runs with on a pool the driver owns in sequence mode, whose
// sessions have it off (sessionDefaults): the setting the session started
// with, or local if that was off — what counter mode's sessions keep.
const durableCommit = "(SELECT CASE WHEN reset_val = 'off' THEN 'local' ELSE reset_val END FROM pg_settings WHERE name = 'synchronous_commit')"

// appNameData is the key, in a connection's pgconn.PgConn.CustomData, of
// the application_name its session started with (read by sessionDefaults),
// on a pool the driver owns. Restoring it from there costs the release
// nothing; reading it back from pg_settings, as a caller's pool must, makes
// the server list every setting it has (about a millisecond under load).
const appNameData = "dlock.application_name"

// startupAppName is the application_name pc's session started with, on a
// pool the driver owns (see appNameData).
func startupAppName(pc *pgxpool.Conn) string {
	v, _ := pc.Conn().PgConn().CustomData()[appNameData].(string)
	return v
}

// acquireParams names the acquire statements' parameters: the lock's key
// (one int8, or two int4 with pair), the key's name, the TTL in
// milliseconds and the label.
func acquireParams(pair bool) (lockArgs, keyArg, msArg, labelArg string) {
	if pair {
		return "$1::int4, $2::int4", "$3", "$4", "$5"
	}
	return "$1::int8", "$2", "$3", "$4"
}

func newStatements(table string, pair, owned bool) statements {
	lockArgs, keyArg, msArg, labelArg := acquireParams(pair)
	// RETURNING runs only for the row the grant inserted or updated.
	fence := func(lockCall string, try, set bool) string {
		cond := ""
		if try {
			cond = " WHERE l.ok"
		}
		return fmt.Sprintf(`WITH l AS (SELECT %s AS ok)
INSERT INTO %s AS f (key, token) SELECT %s::text, 1 FROM l%s
ON CONFLICT (key) DO UPDATE SET token = f.token + 1
RETURNING f.token, pg_backend_pid(), %s`, lockCall, table, keyArg, cond, settings(msArg, labelArg, set))
	}
	s := statements{
		owned:  owned,
		begin:  "BEGIN ISOLATION LEVEL READ COMMITTED",
		commit: "COMMIT",
		setup: `SELECT set_config('idle_in_transaction_session_timeout', $1::text, true),
	set_config('lock_timeout', '0', true),
	set_config('statement_timeout', '0', true),
	CASE WHEN current_setting('synchronous_commit') = 'off' THEN set_config('synchronous_commit', 'local', true) END`,
		ping: `SELECT pg_backend_pid(), set_config('idle_session_timeout', $1::text, false),
	EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
		AND classid = $2::int8::oid AND objid = $3::int8::oid AND objsubid = $4::int2 AND mode = $5::text AND granted)`,
		relabel: `SELECT pg_backend_pid(), set_config('application_name', $1::text, false),
	EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
		AND classid = $2::int8::oid AND objid = $3::int8::oid AND objsubid = $4::int2 AND mode = $5::text AND granted)`,
		reset:    "SELECT set_config('idle_session_timeout', reset_val, false), set_config('application_name', (SELECT reset_val FROM pg_settings WHERE name = 'application_name'), false) FROM pg_settings WHERE name = 'idle_session_timeout'",
		rollback: "ROLLBACK",

		sharedPing:  "SELECT pg_backend_pid(), set_config('idle_session_timeout', $1::text, false)",
		sharedReset: "SELECT set_config('idle_session_timeout', reset_val, false), set_config('application_name', (SELECT reset_val FROM pg_settings WHERE name = 'application_name'), false) FROM pg_settings WHERE name = 'idle_session_timeout'",
	}
	for _, m := range s.lockModes() {
		unlock := "pg_advisory_unlock" + m.suffix + "(" + lockArgs + ")"
		*m.ls = lockStatements{
			unlock:       "SELECT pg_backend_pid(), " + unlock,
			sharedUnlock: "SELECT pg_backend_pid(), " + unlock,
			cleanup:      "SELECT " + unlock,
			mode:         m.mode,
		}
		// pg_advisory_lock returns void; the CTE runs it once, before the insert.
		m.ls.setAcquires(m.suffix, lockArgs, fence)
		if owned { // its last parameter is startupAppName's
			m.ls.unlock = "SELECT pg_backend_pid(), " + unlock + ", set_config('idle_session_timeout', '0', false), " +
				"set_config('application_name', $" + strconv.Itoa(strings.Count(lockArgs, "$")+1) + "::text, false)"
		}
	}
	if owned { // $1 is startupAppName's
		s.sharedReset = "SELECT set_config('idle_session_timeout', '0', false), set_config('application_name', $1::text, false)"
	}
	return s
}

// lockMode is one lock mode's statements and the suffix of its functions'
// names ("" or "_shared"); mode is its name in pg_locks.
type lockMode struct {
	ls           *lockStatements
	suffix, mode string
}

// lockModes lists s's two lock modes: exclusive, shared.
func (s *statements) lockModes() []lockMode {
	return []lockMode{{&s.exclusive, "", "ExclusiveLock"}, {&s.share, "_shared", "ShareLock"}}
}

// setAcquires sets ls's acquire statements (tryLock, tryLockSet, lock),
// built by build for the lock functions with suffix ("" or "_shared") and
// lockArgs: try says the lock call is pg_try_advisory_lock's, whose result
// the statement checks; set, that it sets the session's settings.
func (ls *lockStatements) setAcquires(suffix, lockArgs string, build func(lockCall string, try, set bool) string) {
	try := "pg_try_advisory_lock" + suffix + "(" + lockArgs + ")"
	ls.tryLock = build(try, true, true)
	ls.tryLockSet = build(try, true, false)
	ls.lock = build("pg_advisory_lock"+suffix+"("+lockArgs+")", false, true)
}

// settings ends an acquire's select list: it sets the session's
// idle_session_timeout to msArg and its application_name to labelArg, or,
// for a session that has them already (!set), returns the two arguments as
// they are (they stay in the statement, typed, so that both forms take the
// same arguments and return the same columns).
func settings(msArg, labelArg string, set bool) string {
	if !set {
		return msArg + "::text, " + labelArg + "::text"
	}
	return "set_config('idle_session_timeout', " + msArg + "::text, false),\n\tset_config('application_name', " + labelArg + "::text, false)"
}

// acquireBatch queues the acquire on a caller's pool: stmt (tryLock or lock)
// with args, whose rows onRow scans, in a transaction with setup.
func (s *statements) acquireBatch(stmt string, args []any, ms string, onRow func(pgx.Rows) error) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(s.begin)
	b.Queue(s.setup, ms)
	b.Queue(stmt, args...).Query(onRow)
	b.Queue(s.commit)
	return b
}

// releaseBatch queues the release on a caller's pool: unlock (a
// lockStatements.unlock) with args, whose row onRow scans, then reset.
func (s *statements) releaseBatch(unlock string, args []any, onRow func(pgx.Row) error) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(unlock, args...).QueryRow(onRow)
	b.Queue(s.reset)
	return b
}

// sequenceTokens makes the acquire statements take their token from the
// sequence mode's objects (Options.Tokens), next to table: the epoch in use
// times 2^44 plus the sequence's next value, drawn after the lock is
// granted. A grant that finds the epoch writes no row and is one plain
// SELECT; nextval WAL-logs once per 32 values, and the grant's transaction
// commits with synchronous_commit off (on a pool the driver owns, its
// sessions' setting: see sessionDefaults; on a caller's pool, the
// statement sets it for its own transaction), so that even then it does
// not wait for the WAL to be flushed: the sequence need not survive a crash, since
// the epoch does (below), and a token drawn from a sequence that lost its
// last values has the next epoch. (The commit that would otherwise wait
// for the flush, one grant in 32, costs about 10 µs of the mean cycle with
// fsync on.)
//
// The epoch in use is kept in unlogged objects, which PostgreSQL empties in
// crash recovery and on a promoted standby: the marker table (the authority)
// and, with fastMark (PostgreSQL 15 and later), the marker sequence, a copy
// of it that a grant reads with pg_sequence_last_value — a function call,
// where reading the table is a scan, which costs about as much as the rest of
// the grant's statement (a crash resets the sequence to "never called", and
// the function then returns NULL). A session's first grant reads one of
// the two; a shared session's later grants keep the epoch it read (see
// lockStatements.next).
//
// If the marker is gone, the token comes back NULL and the acquire runs
// s.newEpoch: it bumps the durable epoch and writes the marker table in one
// transaction that writes to a logged table, so its commit is flushed
// (synchronous_commit at least local: on a pool the driver owns, the
// statement raises it for its own transaction to the setting the session
// started with, or local if that was off; on a caller's pool, the
// session's, raised as counter mode's grants raise it) before the client
// sees the token it returns; then s.setMark copies the epoch into the
// marker sequence. Two sessions that find the marker gone at once both
// bump the epoch, but both
// use the one that reached the marker table first (ON CONFLICT DO UPDATE
// reads the committed row); a session that finds the marker sequence reset
// but the table marked (its copy not made yet, or drivers of an earlier
// version, which read the table, got there first) uses the table's epoch.
// The copy is made after the commit, so the sequence never holds an epoch
// the epoch table might not.
func (s *statements) sequenceTokens(table string, pair, fastMark bool) {
	epoch, live, seq, mark := sequenceIdents(table)
	seq = strings.ReplaceAll(seq, "'", "''")
	mark = strings.ReplaceAll(mark, "'", "''")
	lockArgs, keyArg, msArg, labelArg := acquireParams(pair)
	inUse := "(SELECT epoch FROM " + live + " WHERE id = 1)"
	if fastMark {
		inUse = "pg_sequence_last_value('" + mark + "'::regclass)"
		s.setMark = "SELECT setval('" + mark + "', $1::int8, true)"
	}
	// On a caller's pool, whose setup may have raised synchronous_commit
	// to local, a grant sets it off for its own transaction (see above); a
	// pool the driver owns has it off already. The setting costs about 5%
	// of the uncontended cycle.
	asyncCommit := ""
	if !s.owned {
		asyncCommit = " AND set_config('synchronous_commit', 'off', true) IS NOT NULL"
	}
	// The CTE is not inlined (its function is volatile): the lock is taken
	// before the token is drawn. The key's name is not needed here; the
	// condition keeps the statements' parameters those of counter mode.
	stmt := func(lockCall string, try, set bool) string {
		cond := ""
		if try {
			cond = "l.ok AND"
		}
		return fmt.Sprintf(`WITH l AS (SELECT %s AS ok)
SELECT %s * %d + nextval('%s'),
	pg_backend_pid(), %s
FROM l WHERE %s %s::text IS NOT NULL%s`,
			lockCall, inUse, epochUnit, seq, settings(msArg, labelArg, set), cond, keyArg, asyncCommit)
	}
	// CASE evaluates its THEN branch only when its condition holds, so
	// next draws from the sequence only once the lock is granted.
	next := func(suffix string) string {
		return fmt.Sprintf(`SELECT CASE WHEN pg_try_advisory_lock%s(%s)%s THEN nextval('%s') END, pg_backend_pid()`,
			suffix, lockArgs, asyncCommit, seq)
	}
	for _, m := range s.lockModes() {
		m.ls.setAcquires(m.suffix, lockArgs, stmt)
		m.ls.next = next(m.suffix)
	}
	s.newEpoch = fmt.Sprintf(`WITH cur AS (SELECT epoch FROM %s WHERE id = 1),
bump AS (INSERT INTO %s AS e (id, epoch) SELECT 1, 1 WHERE NOT EXISTS (SELECT 1 FROM cur)
	ON CONFLICT (id) DO UPDATE SET epoch = e.epoch + 1 RETURNING e.epoch),
mark AS (INSERT INTO %s AS m (id, epoch) SELECT 1, epoch FROM bump
	ON CONFLICT (id) DO UPDATE SET epoch = m.epoch RETURNING m.epoch)
SELECT COALESCE((SELECT epoch FROM cur), (SELECT epoch FROM mark)) * %d + nextval('%s')`,
		live, epoch, live, epochUnit, seq)
	if s.owned {
		s.newEpoch += `
WHERE set_config('synchronous_commit', ` + durableCommit + `, true) IS NOT NULL`
	}
}

// epochUnit is 2^44: a sequence-mode token is epoch × epochUnit plus the
// sequence's value, which stays below it (the sequence's MAXVALUE).
const epochUnit = 1 << 44
