// tokens=sequence: tokens from the server's UUID_SHORT() counter and a
// durable epoch, with no write on the grant path (docs/mysql.md, Tokens).

package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
)

// The token modes of Options.Tokens.
const (
	// TokensCounter takes each token from a durable per-key counter in
	// Options.Table: a committed write per grant.
	TokensCounter = "counter"
	// TokensSequence takes each token from the server's UUID_SHORT()
	// counter under a durable epoch: no write per grant.
	TokensSequence = "sequence"
)

// seqBits is how many low bits of a sequence-mode token count within an
// epoch: a token is epoch<<seqBits | (UUID_SHORT() - the epoch's base).
const seqBits = 44

// maxEpoch bounds the epoch, so that a token stays below 2^63.
const maxEpoch = 1<<(63-seqBits) - 1

// ErrReadOnly is wrapped by the error of a sequence-mode grant on a server
// that is read-only (a replica): it would draw a token no write fences.
var ErrReadOnly = errors.New("mysql: the server is read-only")

// seqStatements are the sequence mode's SQL, for one fence table.
type seqStatements struct {
	createEpoch string // the durable epoch (InnoDB), if missing
	seedEpoch   string // its one row
	createLive  string // the per-server-life marker (MEMORY), if missing
	// grant: name, timeout, the session's replication position. One
	// column: NULL when GET_LOCK failed, -2 when it timed out; once it
	// granted, 0 on a read-only server, -1 when the replication position
	// is not the session's, else UUID_SHORT(), drawn after the grant.
	grant string
	pos   string // the replication position alone
	// marker: the marker of this server's life (NULL if none), the durable
	// epoch, read_only, and a draw.
	marker string
	bump   string // the durable epoch + 1, in LAST_INSERT_ID()
	mark   string // this server's marker: the bumped epoch and a new base
	draw   string // UUID_SHORT() and the replication position, alone
}

// seqTables returns the names of the sequence mode's tables next to table.
func seqTables(table string) (epoch, live string) {
	return table + "_epoch", table + "_live"
}

func newSeqStatements(table, pos string) seqStatements {
	epoch, live := seqTables(table)
	return seqStatements{
		createEpoch: "CREATE TABLE IF NOT EXISTS " + epoch + " (id TINYINT NOT NULL PRIMARY KEY, epoch BIGINT NOT NULL) ENGINE=InnoDB",
		seedEpoch:   "INSERT IGNORE INTO " + epoch + " (id, epoch) VALUES (1, 0)",
		createLive: "CREATE TABLE IF NOT EXISTS " + live +
			" (server_id INT UNSIGNED NOT NULL PRIMARY KEY, epoch BIGINT NOT NULL, base BIGINT UNSIGNED NOT NULL) ENGINE=MEMORY",
		grant: "SELECT CASE GET_LOCK(?, ?) WHEN 1 THEN IF(@@GLOBAL.read_only, 0, IF(" + pos + " = ?, UUID_SHORT(), -1)) " +
			"WHEN 0 THEN -2 END",
		pos: "SELECT " + pos,
		marker: "SELECT m.epoch, m.base, e.epoch, @@GLOBAL.read_only, UUID_SHORT() FROM (SELECT 1) AS one " +
			"LEFT JOIN " + live + " m ON m.server_id = @@server_id LEFT JOIN " + epoch + " e ON e.id = 1",
		bump: "UPDATE " + epoch + " SET epoch = LAST_INSERT_ID(epoch + 1) WHERE id = 1",
		mark: "REPLACE INTO " + live + " (server_id, epoch, base) VALUES (@@server_id, LAST_INSERT_ID(), UUID_SHORT())",
		draw: "SELECT UUID_SHORT(), " + pos,
	}
}

// replicationPos is the SQL of the server's replication position, which
// changes whenever the server applies a replicated transaction (MariaDB:
// gtid_slave_pos; MySQL: gtid_executed, which changes with local commits
// too). A session's epoch is trusted only while it is unchanged.
func replicationPos(ctx context.Context, db *sql.DB) (string, error) {
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return "", fmt.Errorf("read the server version: %w", err)
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		return "IFNULL(@@GLOBAL.gtid_slave_pos, '')", nil
	}
	return "IFNULL(@@GLOBAL.gtid_executed, '')", nil
}

// ensureTokenMode creates the sequence mode's tables (TokensSequence), or
// checks that the database has none (TokensCounter): a counter token after
// sequence-mode grants would go backwards.
func ensureTokenMode(ctx context.Context, db *sql.DB, o Options, st seqStatements) error {
	epoch, _ := seqTables(o.Table)
	if o.Tokens != TokensSequence {
		schema, name := "", epoch
		if i := strings.IndexByte(epoch, '.'); i >= 0 {
			schema, name = epoch[:i], epoch[i+1:]
		}
		var n int
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = IF(? = '', DATABASE(), ?) AND TABLE_NAME = ?",
			schema, schema, name).Scan(&n)
		if err != nil {
			return fmt.Errorf("look for %s: %w", epoch, err)
		}
		if n > 0 {
			return fmt.Errorf("%w: this database's locks take their tokens from the server's sequence (%s exists): open it with tokens=%s; counter tokens would go backwards",
				dlock.ErrInvalidOption, epoch, TokensSequence)
		}
		return nil
	}
	for _, q := range []string{st.createEpoch, st.seedEpoch, st.createLive} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("create the sequence mode's tables next to %s: %w", o.Table, err)
		}
	}
	return nil
}

// seqState is what a session knows of the epoch it draws tokens under: the
// marker of its server's life it read, and the replication position it read
// before.
type seqState struct {
	epoch int64
	base  uint64
	pos   string
	valid bool
}

// epochLockName is the GET_LOCK name that serializes the epoch bumps of
// every driver of the fence table, whatever its namespace: no key's name has
// this form (LockName's are a namespace, a colon and hex).
func (d *Driver) epochLockName() string {
	name := "dlock-epoch:" + d.opts.Table
	return name[:min(len(name), maxName)]
}

// validate makes cs's epoch that of the marker of its server's life, if the
// marker holds the durable epoch; otherwise it bumps the durable epoch
// (committed before it returns) and writes a new marker, under a GET_LOCK
// that serializes bumps. It refuses a read-only server.
func (d *Driver) validate(ctx context.Context, conn *sql.Conn, cs *connState) error {
	cs.seq.valid = false
	// The position first: a transaction replicated after it changes the
	// position the grants read, which sends them back here.
	var pos string
	if err := conn.QueryRowContext(ctx, d.seq.pos).Scan(&pos); err != nil {
		return fmt.Errorf("read the replication position: %w", err)
	}
	if ok, err := d.readMarker(ctx, conn, cs); err != nil || ok {
		cs.seq.pos = pos
		return err
	}
	name := d.epochLockName()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", name, waitChunk).Scan(&got); err != nil {
		return fmt.Errorf("lock the epoch: %w", err)
	}
	if got.Int64 != 1 {
		return fmt.Errorf("lock the epoch: GET_LOCK(%q) timed out", name)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_, _ = conn.ExecContext(rctx, "DO RELEASE_LOCK(?)", name)
	}()
	if ok, err := d.readMarker(ctx, conn, cs); err != nil || ok {
		cs.seq.pos = pos
		return err
	}
	if _, err := conn.ExecContext(ctx, d.seq.bump); err != nil {
		return fmt.Errorf("bump the epoch: %w", err)
	}
	if _, err := conn.ExecContext(ctx, d.seq.mark); err != nil {
		return fmt.Errorf("mark the epoch: %w", err)
	}
	ok, err := d.readMarker(ctx, conn, cs)
	if err == nil && !ok {
		err = errors.New("the epoch's marker did not hold the bumped epoch")
	}
	cs.seq.pos = pos
	return err
}

// readMarker reads the marker of cs's server's life into cs and reports
// whether it can be used: it holds the durable epoch, and draws are still
// within its range.
func (d *Driver) readMarker(ctx context.Context, conn *sql.Conn, cs *connState) (bool, error) {
	var mEpoch, dEpoch sql.NullInt64
	var base sql.NullString
	var readOnly int
	var u uint64
	if err := conn.QueryRowContext(ctx, d.seq.marker).Scan(&mEpoch, &base, &dEpoch, &readOnly, &u); err != nil {
		return false, fmt.Errorf("read the epoch: %w", err)
	}
	if readOnly != 0 {
		return false, ErrReadOnly
	}
	if !dEpoch.Valid {
		epoch, _ := seqTables(d.opts.Table)
		return false, fmt.Errorf("the epoch table %s has no row", epoch)
	}
	if !mEpoch.Valid || mEpoch.Int64 != dEpoch.Int64 {
		return false, nil
	}
	if mEpoch.Int64 > maxEpoch {
		return false, fmt.Errorf("the epoch %d is beyond %d: tokens would overflow", mEpoch.Int64, maxEpoch)
	}
	b, err := strconv.ParseUint(base.String, 10, 64)
	if err != nil {
		return false, fmt.Errorf("the epoch's marker: base %q: %w", base.String, err)
	}
	if u <= b || u-b >= 1<<seqBits {
		return false, nil // the epoch's range is used up: bump
	}
	cs.seq = seqState{epoch: mEpoch.Int64, base: b, valid: true}
	return true, nil
}

// token is the token of a draw u under cs's epoch, and whether cs's epoch
// may be used for it: the draw must be within the epoch's range and the
// replication position unchanged since the epoch was read.
func (cs *connState) token(u uint64, pos string) (uint64, bool) {
	if !cs.seq.valid || pos != cs.seq.pos || u <= cs.seq.base || u-cs.seq.base >= 1<<seqBits {
		return 0, false
	}
	return uint64(cs.seq.epoch)<<seqBits | (u - cs.seq.base), true
}

// Results of the grant statement that are not a draw.
const (
	drawReadOnly = "0"  // granted on a read-only server
	drawMoved    = "-1" // granted; the replication position moved
	drawRefused  = "-2" // not granted
)

// seqGetLock is getLock in sequence mode: GET_LOCK and, once granted, the
// draw, in one statement; draw is the statement's result when got.
func (d *Driver) seqGetLock(ctx context.Context, conn *sql.Conn, cs *connState, name string, timeout int) (got bool, draw string, cancelled bool, err error) {
	var r sql.NullString
	stmt := func(sctx context.Context) error {
		return conn.QueryRowContext(sctx, d.seq.grant, name, timeout, cs.seq.pos).Scan(&r)
	}
	if timeout == 0 {
		// A try does not wait in the server: no KILL QUERY to send.
		if d.owned {
			stmt = func(sctx context.Context) error {
				v, err := queryPrepared(sctx, conn, &cs.grantStmt, d.seq.grant, name, int64(0), cs.seq.pos)
				r.String, r.Valid = valueString(v)
				return err
			}
		}
		var ok bool
		ok, err = d.quick(ctx, cs, stmt)
		cancelled = !ok || (err != nil && d.closed.Load())
	} else {
		cancelled, err = d.killable(ctx, cs, stmt)
	}
	switch {
	case cancelled || err != nil:
		return false, "", cancelled, err
	case !r.Valid:
		return false, "", false, fmt.Errorf("GET_LOCK(%q) returned NULL", name)
	case r.String == drawRefused:
		return false, "", false, nil
	}
	return true, r.String, false, nil
}

// seqGrant makes the grant of a lock the session took, with the result of
// its GET_LOCK statement, sent at start. A draw cs's epoch cannot vouch for
// is made again after validate.
func (d *Driver) seqGrant(ctx context.Context, req backend.AcquireRequest, conn *sql.Conn, cs *connState, name, draw string, start time.Time) (*backend.Grant, error) {
	fail := func(err error) (*backend.Grant, error) {
		// Closing the session frees the lock: nobody was told it was held.
		d.discardHolding(conn, cs, name)
		if ctx.Err() != nil && err == nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("token: %w", err)
	}
	var (
		token uint64
		ok    bool
	)
	switch draw {
	case drawReadOnly:
		return fail(fmt.Errorf("%w (read_only is set: a replica)", ErrReadOnly))
	case drawMoved:
	default:
		u, err := strconv.ParseUint(draw, 10, 64)
		if err != nil {
			return fail(fmt.Errorf("UUID_SHORT() gave %q: %w", draw, err))
		}
		token, ok = cs.token(u, cs.seq.pos)
	}
	if !ok {
		var u uint64
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if err := d.validate(sctx, conn, cs); err != nil {
			return fail(err)
		}
		var again string
		if err := conn.QueryRowContext(sctx, d.seq.draw).Scan(&u, &again); err != nil {
			return fail(err)
		}
		if token, ok = cs.token(u, again); !ok {
			return fail(errors.New("the replication position moved, or the epoch's range ran out, while the epoch was read: try again"))
		}
	}
	if ctx.Err() != nil {
		return fail(nil)
	}
	if wait := time.Since(start); wait > req.TTL/4 {
		// A long wait in GET_LOCK ate into the validity, counted from before
		// it: restart the session's idle countdown, and the lease's clock.
		start = time.Now()
		sctx, cancel := statementCtx(ctx)
		var r sql.NullInt64
		err := conn.QueryRowContext(sctx, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", name).Scan(&r)
		cancel()
		if err == nil && r.Int64 != 1 {
			err = fmt.Errorf("the session does not hold %s", name)
		}
		if err != nil {
			return fail(err)
		}
	}
	return d.granted(req, conn, cs, name, token, start), nil
}
