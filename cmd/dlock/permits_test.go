//go:build unix

package main

import (
	"context"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/semaphore"
)

// dlock run --permits N holds a permit of the semaphore KEY: busy when all
// are held, in when one is free (DLOCK_KEY names its slot), refused when
// the holders use another N, and N is checked.
func TestRunPermits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.StartRedis(t).URL()
	env := []string{"DLOCK_DSN=" + dsn}
	l, err := dlock.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sem, err := semaphore.New(l, "gpu", 2)
	if err != nil {
		t.Fatal(err)
	}
	a, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}

	r := runCLI(t, env, "run", "--permits", "2", "--no-wait", "gpu", "--", "true")
	r.expectCode(t, exitBusy)
	if !strings.Contains(r.stderr, `all 2 permits of the semaphore "gpu" are held`) {
		t.Errorf("busy message:\n%s", r.stderr)
	}

	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, env, "run", "--permits", "2", "gpu", "--", "sh", "-c", `echo "$DLOCK_KEY $DLOCK_TOKEN"`)
	r.expectCode(t, 0)
	key, tok, _ := strings.Cut(strings.TrimSpace(r.stdout), " ")
	if key != b.Key() || tok == "" || tok == "0" {
		t.Errorf("DLOCK_KEY DLOCK_TOKEN = %q, want the free slot %q and its token", r.stdout, b.Key())
	}

	r = runCLI(t, env, "run", "--permits", "3", "gpu", "--", "true")
	r.expectCode(t, exitUsage)
	if !strings.Contains(r.stderr, "disagree on the number of permits") {
		t.Errorf("mismatch message:\n%s", r.stderr)
	}
	for _, bad := range []string{"0", "-1", "1025"} {
		r = runCLI(t, env, "run", "--permits", bad, "gpu", "--", "true")
		r.expectCode(t, exitUsage)
		if !strings.Contains(r.stderr, "--permits must be 1..1024") {
			t.Errorf("--permits %s: %s", bad, r.stderr)
		}
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
