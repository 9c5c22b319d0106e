package dlockcron_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockcron"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/schedule"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// everySecond is a cron expression with a seconds field: every second.
func everySecond(t testing.TB) cron.Schedule {
	s, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse("* * * * * *")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestOneRunPerTick: two crons on one Redis, a job every second: each
// activation runs once, and the run's scheduled time is the activation's,
// whenever each cron got to it.
func TestOneRunPerTick(t *testing.T) {
	url := testenv.StartRedis(t).URL()
	var mu sync.Mutex
	runs := map[time.Time]int{}
	fn := func(ctx context.Context, _ *dlock.Lease) error {
		at, _ := schedule.ScheduledAt(ctx)
		mu.Lock()
		runs[at]++
		mu.Unlock()
		return nil
	}
	job := schedule.Job{Name: "report", AtMost: 5 * time.Second, Retention: time.Minute}
	for range 2 {
		l, err := dlock.Open(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		j, err := dlockcron.NewJob(l, job, everySecond(t), fn, nil)
		if err != nil {
			t.Fatal(err)
		}
		c := cron.New(cron.WithSeconds())
		c.Schedule(everySecond(t), j)
		c.Start()
		t.Cleanup(func() { <-c.Stop().Done() })
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(runs)
		mu.Unlock()
		if n >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs in 30 s", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for at, n := range runs {
		if n != 1 {
			t.Errorf("the activation at %v ran %d times, want 1", at.Format("15:04:05.000"), n)
		}
		if at.Nanosecond() != 0 {
			t.Errorf("a run's scheduled time %v is not its activation (a whole second)", at.Format("15:04:05.000"))
		}
	}
}
