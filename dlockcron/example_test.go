package dlockcron_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockcron"
	_ "github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/schedule"
)

// Two crons, as on two hosts, share a backend (memlock here; a redis://,
// pgtable:// or etcd:// DSN across hosts): each activation runs once, on
// one of them.
func Example() {
	var mu sync.Mutex
	runs := map[time.Time]int{} // per activation
	report := func(ctx context.Context, lease *dlock.Lease) error {
		at, _ := schedule.ScheduledAt(ctx)
		mu.Lock()
		defer mu.Unlock()
		runs[at]++
		return nil
	}
	everySecond, _ := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse("* * * * * *")

	var crons []*cron.Cron
	for range 2 {
		locker, _ := dlock.Open(context.Background(), "mem://example-cron")
		defer locker.Close()
		job, _ := dlockcron.NewJob(locker, schedule.Job{Name: "report", AtMost: time.Minute}, everySecond, report, nil)
		c := cron.New(cron.WithSeconds())
		c.Schedule(everySecond, job)
		c.Start()
		crons = append(crons, c)
	}
	for {
		mu.Lock()
		n := len(runs)
		mu.Unlock()
		if n >= 3 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, c := range crons {
		<-c.Stop().Done()
	}
	once := true
	for _, n := range runs {
		once = once && n == 1
	}
	fmt.Println("every activation ran once:", once)
	// Output: every activation ran once: true
}
