package fencing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock"
)

// Execer is the one method SQLGuard needs, which *sql.DB, *sql.Tx and
// *sql.Conn have (ExecFunc adapts others). One that also has QueryRowContext
// lets a rejection tell a stale token from a missing row.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// ExecFunc adapts to Execer a function that runs a statement and returns the
// number of rows it changed, such as a wrapper of pgx's Exec that returns
// tag.RowsAffected().
type ExecFunc func(ctx context.Context, query string, args ...any) (rowsAffected int64, err error)

// ExecContext runs f and returns its row count as a sql.Result.
func (f ExecFunc) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	n, err := f(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rowsAffected(n), nil
}

type rowsAffected int64

func (r rowsAffected) LastInsertId() (int64, error) {
	return 0, errors.New("fencing: LastInsertId is not available")
}
func (r rowsAffected) RowsAffected() (int64, error) { return int64(r), nil }

// rowQuerier is database/sql's single-row query, which *sql.DB, *sql.Tx and
// *sql.Conn have.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// ErrNoRow is matched (errors.Is) by the error of a guarded write whose row
// does not exist. It is reported only when the Execer can also query (see
// Execer); otherwise a missing row reads as a stale token.
var ErrNoRow = errors.New("fencing: no such row")

// Dollar renders the n-th statement parameter as $n (PostgreSQL,
// CockroachDB): SQLGuard's default Placeholder.
func Dollar(n int) string { return "$" + strconv.Itoa(n) }

// QuestionMark renders every statement parameter as ? (MySQL, MariaDB,
// SQLite), for SQLGuard.Placeholder.
func QuestionMark(int) string { return "?" }

// SQLGuard performs writes that an SQL table checks against fencing tokens,
// in a fence column of each guarded row; like [Guard] it accepts an equal
// token and rejects a lower one, and token 0. It holds no state and is safe
// for concurrent use; Table is required (docs/guide.md has the pattern).
type SQLGuard struct {
	// Table names the table, as it must appear in SQL; quote it yourself if
	// it needs quoting. Required.
	Table string

	// KeyColumn identifies a row. Default "id".
	KeyColumn string

	// FenceColumn holds the highest token that wrote the row: a 64-bit
	// integer (bigint), best NOT NULL DEFAULT 0. A NULL fence accepts any
	// token. Default "fence".
	FenceColumn string

	// Placeholder renders the n-th (1-based) statement parameter. Default
	// Dollar ($n, PostgreSQL); QuestionMark for MySQL and SQLite.
	Placeholder func(n int) string

	// OnReject, if set, is called with every rejection of a stale token:
	// count it (package dlockotel's RejectionCounter) or log it. It must not
	// block.
	OnReject func(*StaleTokenError)
}

// reject returns e, after telling OnReject.
func (g *SQLGuard) reject(e *StaleTokenError) error {
	if g.OnReject != nil {
		g.OnReject(e)
	}
	return e
}

// Update runs
//
//	UPDATE Table SET <set>, fence = <token> WHERE id = <key> AND (fence IS NULL OR fence <= <token>)
//
// on db, with set an SQL assignment list whose parameters are args, numbered
// from 1 in the Placeholder style ("balance = $1"). It fails with ErrStaleToken
// if the row carries a higher token (or token is 0), and with ErrNoRow if
// there is no such row and db can tell.
func (g *SQLGuard) Update(ctx context.Context, db Execer, token dlock.Token, key any, set string, args ...any) error {
	if g.Table == "" {
		return errors.New("fencing: SQLGuard.Table is empty")
	}
	resource := g.Table + ":" + fmt.Sprint(key)
	if token == 0 || token > math.MaxInt64 {
		return g.reject(&StaleTokenError{Resource: resource, Token: token})
	}
	ph := g.Placeholder
	if ph == nil {
		ph = Dollar
	}
	fence, keyCol := g.fenceColumn(), g.keyColumn()
	n := len(args)
	var q strings.Builder
	q.WriteString("UPDATE " + g.Table + " SET ")
	if strings.TrimSpace(set) != "" {
		q.WriteString(set + ", ")
	}
	fmt.Fprintf(&q, "%s = %s WHERE %s = %s AND (%s IS NULL OR %s <= %s)",
		fence, ph(n+1), keyCol, ph(n+2), fence, fence, ph(n+3))
	tok := int64(token)
	res, err := db.ExecContext(ctx, q.String(), append(args[:n:n], tok, key, tok)...)
	if err != nil {
		return fmt.Errorf("fencing: guarded update of %s: %w", resource, err)
	}
	changed, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("fencing: guarded update of %s: %w", resource, err)
	}
	if changed > 0 {
		return nil
	}
	qr, ok := db.(rowQuerier)
	if !ok {
		return g.reject(&StaleTokenError{Resource: resource, Token: token})
	}
	// Why did no row change? (A statement of its own: the answer is only
	// for the error message, and for MySQL, which counts a row whose values
	// did not change as unchanged.)
	var highest sql.NullInt64
	err = qr.QueryRowContext(ctx, fmt.Sprintf("SELECT %s FROM %s WHERE %s = %s", fence, g.Table, keyCol, ph(1)), key).Scan(&highest)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: %s", ErrNoRow, resource)
	case err != nil:
		return fmt.Errorf("fencing: guarded update of %s changed no row, and reading its fence failed: %w", resource, err)
	case !highest.Valid || highest.Int64 <= tok:
		return nil // matched but unchanged (MySQL)
	}
	return g.reject(&StaleTokenError{Resource: resource, Token: token, Highest: dlock.Token(highest.Int64)})
}

// Fence is Update with an empty set: it advances the row's fence to token.
// Run first in a transaction (db a *sql.Tx), it fences the transaction's
// other writes, as the row stays locked until the transaction ends.
func (g *SQLGuard) Fence(ctx context.Context, db Execer, token dlock.Token, key any) error {
	return g.Update(ctx, db, token, key, "")
}

func (g *SQLGuard) keyColumn() string {
	if g.KeyColumn == "" {
		return "id"
	}
	return g.KeyColumn
}

func (g *SQLGuard) fenceColumn() string {
	if g.FenceColumn == "" {
		return "fence"
	}
	return g.FenceColumn
}
