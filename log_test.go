package dlock_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// recorder is a slog.Handler that keeps every record.
type recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// find returns the attributes of the first record with message msg.
func (r *recorder) find(msg string) (map[string]string, slog.Level, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if rec.Message == msg {
			as := map[string]string{}
			rec.Attrs(func(a slog.Attr) bool { as[a.Key] = a.Value.String(); return true })
			return as, rec.Level, true
		}
	}
	return nil, 0, false
}

// TestLoggerEvents: WithLogger logs a grant, a refused try, a release and a
// lost lease, with the backend, key and token, at the documented levels;
// WithLogKeys(false) leaves the key out.
func TestLoggerEvents(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	l, err := dlock.Open(ctx, "mem://logger-events", dlock.WithLogger(slog.New(rec)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.Acquire(ctx, "jobs/a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "jobs/a"); err == nil {
		t.Fatal("TryAcquire of a held key succeeded")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lost, err := l.Acquire(ctx, "jobs/b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dlock.Break(ctx, l, "jobs/b"); err != nil {
		t.Fatal(err)
	}
	<-lost.Done()

	for _, c := range []struct {
		msg   string
		level slog.Level
		want  map[string]string
	}{
		{"dlock: acquired", slog.LevelDebug, map[string]string{"backend": "mem", "key": "jobs/a", "token": lease.Token().String(), "wait": "true"}},
		{"dlock: not acquired", slog.LevelDebug, map[string]string{"key": "jobs/a", "result": "not-acquired", "wait": "false"}},
		{"dlock: released", slog.LevelDebug, map[string]string{"key": "jobs/a", "token": lease.Token().String()}},
		{"dlock: lease lost", slog.LevelError, map[string]string{"key": "jobs/b", "cause": "backend-reported"}},
	} {
		as, level, ok := rec.find(c.msg)
		if !ok {
			t.Errorf("no %q record", c.msg)
			continue
		}
		if level != c.level {
			t.Errorf("%q at level %v, want %v", c.msg, level, c.level)
		}
		for k, v := range c.want {
			if as[k] != v {
				t.Errorf("%q: %s=%q, want %q (all: %v)", c.msg, k, as[k], v, as)
			}
		}
	}

	quiet := &recorder{}
	l2, err := dlock.Open(ctx, "mem://logger-events", dlock.WithLogger(slog.New(quiet)), dlock.WithLogKeys(false))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	lease2, err := l2.Acquire(ctx, "jobs/secret", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	_ = lease2.Release(ctx)
	lost2, err := l2.Acquire(ctx, "jobs/secret")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dlock.Break(ctx, l2, "jobs/secret"); err != nil {
		t.Fatal(err)
	}
	<-lost2.Done()
	if _, _, ok := quiet.find("dlock: lease lost"); !ok {
		t.Error("no lease-lost record with WithLogKeys(false)")
	}
	quiet.mu.Lock()
	defer quiet.mu.Unlock()
	for _, r := range quiet.recs {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "key" || strings.Contains(a.Value.String(), "jobs/secret") {
				t.Errorf("WithLogKeys(false): record %q has %s=%v", r.Message, a.Key, a.Value)
			}
			return true
		})
	}
}
