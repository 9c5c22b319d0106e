package bench

import (
	"context"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/election"
	"github.com/dlock-go/dlock/internal/testenv"
)

// candidate is one side of the hand-over benchmark: it campaigns until it
// leads, and resigns.
type candidate interface {
	campaign(ctx context.Context) error
	resign(ctx context.Context) error
}

type dlockCandidate struct {
	l    dlock.Locker
	name string
	ld   *election.Leadership
}

func (c *dlockCandidate) campaign(ctx context.Context) (err error) {
	c.ld, err = election.Campaign(ctx, c.l, c.name, "bench")
	return err
}

func (c *dlockCandidate) resign(ctx context.Context) error { return c.ld.Resign(ctx) }

// etcdCandidate campaigns with a new concurrency.Election on its session
// each time, as a process that starts campaigning would.
type etcdCandidate struct {
	s   *concurrency.Session
	pfx string
	e   *concurrency.Election
}

func (c *etcdCandidate) campaign(ctx context.Context) error {
	c.e = concurrency.NewElection(c.s, c.pfx)
	return c.e.Campaign(ctx, "bench")
}

func (c *etcdCandidate) resign(ctx context.Context) error { return c.e.Resign(ctx) }

// handoverQueueWait is how long a waiting candidate is given to queue before
// the leader resigns: the backends have no signal for it that all share.
const handoverQueueWait = 5 * time.Millisecond

// runHandover times b.N hand-overs between two candidates: the leader
// resigns while the other waits in Campaign; the time is from the start of
// the resign to the other's Campaign returning.
func runHandover(b *testing.B, a, c candidate) {
	ctx := context.Background()
	if err := a.campaign(ctx); err != nil {
		b.Fatal(err)
	}
	leader, waiter := a, c
	times := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		led := make(chan error, 1)
		var at time.Time
		go func() {
			err := waiter.campaign(ctx)
			at = time.Now()
			led <- err
		}()
		time.Sleep(handoverQueueWait)
		start := time.Now()
		if err := leader.resign(ctx); err != nil {
			b.Fatal(err)
		}
		if err := <-led; err != nil {
			b.Fatal(err)
		}
		times = append(times, at.Sub(start))
		leader, waiter = waiter, leader
	}
	b.StopTimer()
	_ = leader.resign(ctx)
	slices.Sort(times)
	report(b, float64(times[len(times)/2].Nanoseconds()), "handover-p50-ns")
	report(b, float64(times[len(times)*99/100].Nanoseconds()), "handover-p99-ns")
}

// BenchmarkElection measures a leader's hand-over (Resign → the waiting
// candidate leads) with package election on every backend, and with etcd's
// concurrency.Election on the same etcd server.
func BenchmarkElection(b *testing.B) {
	redisSrv := testenv.StartRedis(b)
	etcdSrv := testenv.StartEtcd(b)
	zkSrv := testenv.StartZooKeeper(b)
	pgSrv := testenv.StartPostgres(b)
	mySrv := testenv.StartMariaDB(b)
	dsns := []struct{ name, dsn string }{
		{"redis", redisSrv.URL()},
		{"redis-fair", redisSrv.URL() + "?fair=true"},
		{"etcd", etcdSrv.URL() + "/bench-election"},
		{"zookeeper", zkSrv.URL("/bench-election") + "?session=10s"},
		{"postgres", pgSrv.URL()},
		{"mysql", mySrv.URL("mysql")},
	}
	for _, d := range dsns {
		b.Run("Handover/"+d.name+"/dlock", func(b *testing.B) {
			name := uniqueKey("election", d.name)
			runHandover(b, &dlockCandidate{l: openDlock(b, d.dsn, benchTTL), name: name},
				&dlockCandidate{l: openDlock(b, d.dsn, benchTTL), name: name})
		})
	}
	b.Run("Handover/etcd/etcd-election", func(b *testing.B) {
		pfx := uniqueKey("etcd-election", "")
		session := func() *concurrency.Session {
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdSrv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = cli.Close() })
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			return s
		}
		runHandover(b, &etcdCandidate{s: session(), pfx: pfx}, &etcdCandidate{s: session(), pfx: pfx})
	})
}
