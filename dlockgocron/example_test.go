package dlockgocron_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockgocron"
	_ "github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/schedule"
)

// Two gocron schedulers, as on two hosts, share a backend (memlock here; a
// redis://, pgtable:// or etcd:// DSN across hosts): every second, one of
// them runs the job.
func Example() {
	var mu sync.Mutex
	runs := map[time.Time]int{} // per tick
	report := func() {
		mu.Lock()
		defer mu.Unlock()
		runs[time.Now().Round(time.Second)]++
	}

	var schedulers []gocron.Scheduler
	for range 2 {
		locker, _ := dlock.Open(context.Background(), "mem://example-gocron")
		defer locker.Close()
		lk, _ := dlockgocron.NewLocker(locker, schedule.Job{AtMost: time.Minute, AtLeast: 500 * time.Millisecond}, time.Second)
		s, _ := gocron.NewScheduler(gocron.WithDistributedLocker(lk))
		_, _ = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(report), gocron.WithName("report"))
		s.Start()
		schedulers = append(schedulers, s)
	}
	for {
		mu.Lock()
		n := len(runs)
		mu.Unlock()
		if n > 3 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, s := range schedulers {
		_ = s.Shutdown()
	}
	once := true
	for _, n := range runs {
		once = once && n == 1
	}
	fmt.Println("every tick ran once:", once)
	// Output: every tick ran once: true
}
