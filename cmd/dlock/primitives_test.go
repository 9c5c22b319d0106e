package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/rwlock"
	"github.com/dlock-go/dlock/semaphore"
)

// TestInspectPrimitives: dlock inspect and dlock ls, on real servers, show a
// semaphore with both of its permits held as "2 of 2 permits held, by …"
// (or, where the backend does not record the number of permits, say so),
// a read/write lock held by two readers as such, and one held by a writer;
// and -o json prints the same.
func TestInspectPrimitives(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		name     string
		dsn      func(t *testing.T) string
		permits  bool // the backend records the number of permits
		portable bool // rwlock's portable layout (no shared locks)
	}{
		{"redis", func(t *testing.T) string { return testenv.StartRedis(t).URL() }, true, false},
		{"redis-fair", func(t *testing.T) string { return testenv.StartRedis(t).URL() + "?fair=true" }, true, true},
		{"etcd", func(t *testing.T) string { return testenv.StartEtcd(t).URL() + "/inspect" }, true, false},
		{"postgres", func(t *testing.T) string { return testenv.StartPostgres(t).URL() }, true, false},
		{"zookeeper", func(t *testing.T) string { return testenv.StartZooKeeper(t).URL("/inspect") }, false, false},
	} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := b.dsn(t)
			env := []string{"DLOCK_DSN=" + dsn}
			l, err := dlock.Open(ctx, dsn, dlock.WithLabel("holder-a"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })

			sem, err := semaphore.New(l, "gpu", 2)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				p, err := sem.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = p.Release(context.Background()) })
			}
			cfg, err := rwlock.New(l, "cfg")
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				h, err := cfg.RLock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = h.Release(context.Background()) })
			}
			db, err := rwlock.New(l, "db")
			if err != nil {
				t.Fatal(err)
			}
			w, err := db.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = w.Release(context.Background()) })

			// The semaphore.
			r := runCLI(t, env, "inspect", "gpu")
			t.Logf("dlock inspect gpu:\n%s", r.stdout)
			want := "2 of 2 permits held, by "
			if !b.permits {
				want = "2 permits held (of how many, the backend does not say), by "
			}
			if r.code != 0 || !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "gpu/permits/0") || !strings.Contains(r.stdout, "gpu/permits/1") {
				t.Errorf("dlock inspect gpu: exit %d, want 0 and %q with both slots:\n%s%s", r.code, want, r.stdout, r.stderr)
			}
			// The readers.
			r = runCLI(t, env, "inspect", "cfg")
			t.Logf("dlock inspect cfg:\n%s", r.stdout)
			if r.code != 0 || !strings.Contains(r.stdout, "for reading, by 2 readers") {
				t.Errorf("dlock inspect cfg: exit %d, want 0 and %q:\n%s%s", r.code, "for reading, by 2 readers", r.stdout, r.stderr)
			}
			// The writer.
			r = runCLI(t, env, "inspect", "db")
			t.Logf("dlock inspect db:\n%s", r.stdout)
			want = "for writing, by the writer "
			if !b.portable {
				want = "a read/write lock's writer"
			}
			if r.code != 0 || !strings.Contains(r.stdout, want) {
				t.Errorf("dlock inspect db: exit %d, want 0 and %q:\n%s%s", r.code, want, r.stdout, r.stderr)
			}
			// ls groups them.
			r = runCLI(t, env, "ls")
			t.Logf("dlock ls:\n%s", r.stdout)
			for _, want := range [][]string{{"gpu", "semaphore"}, {"cfg", "rwlock", "2 readers"}} {
				found := false
				for line := range strings.Lines(r.stdout) {
					if f := strings.Fields(line); len(f) >= len(want) && f[0] == want[0] && f[1] == want[1] && (len(want) < 3 || strings.Contains(line, want[2])) {
						found = true
					}
				}
				if !found {
					t.Errorf("dlock ls: no line %q:\n%s%s", want, r.stdout, r.stderr)
				}
			}

			// -o json.
			var v struct {
				Key         string `json:"key"`
				Kind        string `json:"kind"`
				Held        bool   `json:"held"`
				Mode        string `json:"mode"`
				Readers     int    `json:"readers"`
				Permits     *int   `json:"permits"`
				PermitsHeld *int   `json:"permits_held"`
				Holders     []struct {
					Key   string `json:"key"`
					Token uint64 `json:"token"`
				} `json:"holders"`
				Notes []string `json:"notes"`
			}
			r = runCLI(t, env, "inspect", "-o", "json", "gpu")
			t.Logf("dlock inspect -o json gpu:\n%s", r.stdout)
			if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
				t.Fatalf("dlock inspect -o json gpu: %v\n%s%s", err, r.stdout, r.stderr)
			}
			switch {
			case v.Kind != "semaphore" || !v.Held || v.PermitsHeld == nil || *v.PermitsHeld != 2 || len(v.Holders) != 2:
				t.Errorf("dlock inspect -o json gpu:\n%s", r.stdout)
			case b.permits && (v.Permits == nil || *v.Permits != 2):
				t.Errorf("dlock inspect -o json gpu: permits %v, want 2:\n%s", v.Permits, r.stdout)
			case !b.permits && (v.Permits != nil || len(v.Notes) == 0):
				t.Errorf("dlock inspect -o json gpu: permits %v, want none and a note:\n%s", v.Permits, r.stdout)
			}
			for i, h := range v.Holders {
				if h.Key != semaphore.SlotKey("gpu", i) || h.Token == 0 {
					t.Errorf("holder %d: %+v, want slot %d and its token", i, h, i)
				}
			}
			v.Holders = nil
			r = runCLI(t, env, "inspect", "-o", "json", "cfg")
			if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Kind != "rwlock" || v.Mode != "read" || v.Readers != 2 {
				t.Errorf("dlock inspect -o json cfg (%v):\n%s", err, r.stdout)
			}
			var vs []map[string]any
			r = runCLI(t, env, "ls", "-o", "json")
			if err := json.Unmarshal([]byte(r.stdout), &vs); err != nil || len(vs) != 3 {
				t.Errorf("dlock ls -o json: %v, want 3 objects (gpu, cfg, db):\n%s", err, r.stdout)
			}
		})
	}
}

// TestInspectCannotList: where the backend cannot list its locks
// (PostgreSQL with tokens=sequence), dlock inspect of a semaphore's name
// says that it cannot tell, rather than only "held: no".
func TestInspectCannotList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.StartPostgres(t).URL() + "&tokens=sequence"
	l, err := dlock.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	sem, err := semaphore.New(l, "gpu", 2)
	if err != nil {
		t.Fatal(err)
	}
	p, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Release(context.Background()) })
	r := runCLI(t, []string{"DLOCK_DSN=" + dsn}, "inspect", "gpu")
	if r.code != exitFailure || !strings.Contains(r.stdout, "cannot list its locks") || !strings.Contains(r.stdout, "gpu/permits/0") {
		t.Errorf("dlock inspect gpu on a backend that cannot list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The slot itself can be inspected.
	runCLI(t, []string{"DLOCK_DSN=" + dsn}, "inspect", p.Key()).expectCode(t, exitOK)
}
