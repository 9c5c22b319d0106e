package dlockgocron_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockgocron"
	"github.com/dlock-go/dlock/internal/testenv"
	_ "github.com/dlock-go/dlock/redis"
	"github.com/dlock-go/dlock/schedule"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ticks counts the runs of each tick (the second a run was due).
type ticks struct {
	mu   sync.Mutex
	runs map[time.Time]int
}

func (c *ticks) ran() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[time.Time]int{}
	}
	c.runs[time.Now().Round(time.Second)]++
}

// check fails unless at least n ticks ran, each once.
func (c *ticks) check(t *testing.T, n int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for at, runs := range c.runs {
		if runs != 1 {
			t.Errorf("the tick at %v ran %d times, want 1", at.Format("15:04:05"), runs)
		}
	}
	if len(c.runs) < n {
		t.Errorf("%d ticks ran, want at least %d", len(c.runs), n)
	}
}

// startScheduler starts a gocron scheduler with opts and a job every second.
func startScheduler(t *testing.T, job func(), opts ...gocron.SchedulerOption) {
	t.Helper()
	s, err := gocron.NewScheduler(opts...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(job), gocron.WithName("report")); err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { _ = s.Shutdown() })
}

func openRedis(t *testing.T, url string) dlock.Locker {
	t.Helper()
	l, err := dlock.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// waitTicks waits until c has n ticks, at most 30 s.
func waitTicks(t *testing.T, c *ticks, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.mu.Lock()
		got := len(c.runs)
		c.mu.Unlock()
		if got >= n+1 { // the last may still be running on the other scheduler
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d ticks ran in 30 s", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLockerOneRunPerTick: two schedulers on one Redis, a job every second:
// each tick runs once, on one of them.
func TestLockerOneRunPerTick(t *testing.T) {
	url := testenv.StartRedis(t).URL()
	var c ticks
	job := schedule.Job{AtMost: 5 * time.Second, AtLeast: 500 * time.Millisecond, Retention: time.Minute}
	for range 2 {
		lk, err := dlockgocron.NewLocker(openRedis(t, url), job, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		startScheduler(t, c.ran, gocron.WithDistributedLocker(lk))
	}
	waitTicks(t, &c, 4)
	c.check(t, 4)
}

// TestElectorOneRunPerTick: two schedulers on one Redis with an Elector:
// only the leader runs the job.
func TestElectorOneRunPerTick(t *testing.T) {
	url := testenv.StartRedis(t).URL()
	var c ticks
	for i := range 2 {
		e, err := dlockgocron.NewElector(openRedis(t, url), "scheduler", "node"+string(rune('a'+i)), dlock.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := e.Close(); err != nil {
				t.Error(err)
			}
		})
		startScheduler(t, c.ran, gocron.WithDistributedElector(e))
	}
	waitTicks(t, &c, 4)
	c.check(t, 4)
}
