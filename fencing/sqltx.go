package fencing

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/dlock-go/dlock"
)

// TxBeginner starts transactions: *sql.DB and *sql.Conn.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// InTx runs fn in a transaction that first advances the fence of the row key
// to token (Fence), and commits it if fn returns nil; otherwise, and if the
// token is stale, it rolls back and returns the error (fn does not run on a
// stale token). The fence row stays locked until the transaction ends, so
// fn's statements, on any table, are fenced as one atomic step with the
// check: the row can be a fence column of the data's own table or of a
// table of fences (docs/guards.md).
func (g *SQLGuard) InTx(ctx context.Context, db TxBeginner, token dlock.Token, key any, fn func(tx *sql.Tx) error) (err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("fencing: begin a guarded transaction on %s:%v: %w", g.Table, key, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err := g.Fence(ctx, tx, token, key); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("fencing: commit a guarded transaction on %s:%v: %w", g.Table, key, err)
	}
	return nil
}
