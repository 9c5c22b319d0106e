//go:build dlocktest

package main

// This file is built only with -tags dlocktest (TestMain builds the dlock
// binary of the tests so): it registers brokentoken://NAME, an in-process
// backend (mem://NAME's store) whose grants all carry token 1, so that
// TestCheckNotFooled can show that dlock check fails it in its own column.

import (
	"context"
	"net/url"

	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/memlock"
)

func init() {
	backend.Register("brokentoken", func(_ context.Context, u *url.URL) (backend.Driver, error) {
		if err := backend.NewParams(u).Done(); err != nil {
			return nil, err
		}
		return brokenTokens{memlock.Shared("brokentoken/" + u.Host).NewDriver()}, nil
	})
}

// brokenTokens is a driver whose tokens never increase.
type brokenTokens struct{ backend.Driver }

func (d brokenTokens) Acquire(ctx context.Context, req backend.AcquireRequest) (*backend.Grant, error) {
	g, err := d.Driver.Acquire(ctx, req)
	if g != nil {
		g.Token = 1
	}
	return g, err
}
