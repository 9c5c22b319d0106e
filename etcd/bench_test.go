package etcd_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/conformance"
	"github.com/dlock-go/dlock/internal/testenv"
)

// BenchmarkPeers measures what dlock's etcd driver is compared with, on one
// etcd node (compare with BenchmarkConformance's AcquireRelease and Handoff8
// using benchstat):
//
//   - Floor: the least a lease lock can cost: one transaction that puts the
//     key if absent, attached to an existing lease, and one delete.
//   - Mutex: concurrency.Mutex Lock + Unlock on one session, uncontended.
//   - Interleaved: the floor, Mutex and dlock's TryAcquire + Release in turn,
//     with their medians and dlock's speed relative to the other two.
//   - MutexHandoff8: 8 clients, each with its own session, contend for one
//     concurrency.Mutex; the same metrics as conformance's Handoff8.
func BenchmarkPeers(b *testing.B) {
	srv := testenv.StartEtcd(b)
	eps := []string{srv.Endpoint()}
	ctx := context.Background()

	b.Run("Floor", func(b *testing.B) {
		cli := rawClient(b, eps)
		lease, err := cli.Grant(ctx, 60)
		if err != nil {
			b.Fatal(err)
		}
		key := "/bench/floor/" + fmt.Sprint(time.Now().UnixNano())
		b.ReportAllocs()
		for b.Loop() {
			resp, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, "", clientv3.WithLease(lease.ID))).
				Commit()
			if err != nil || !resp.Succeeded {
				b.Fatal(err, resp.Succeeded)
			}
			if _, err := cli.Delete(ctx, key); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("Mutex", func(b *testing.B) {
		s, err := concurrency.NewSession(rawClient(b, eps), concurrency.WithTTL(60))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		m := concurrency.NewMutex(s, "/bench/mutex/"+fmt.Sprint(time.Now().UnixNano()))
		b.ReportAllocs()
		for b.Loop() {
			if err := m.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})

	// Interleaved runs one floor, one Mutex and one dlock acquire+release per
	// iteration, in turn, so that a noisy machine slows all three alike, and
	// reports each one's median and dlock's speed relative to the others
	// (higher is better; 1 means as fast).
	b.Run("Interleaved", func(b *testing.B) {
		cli := rawClient(b, eps)
		lease, err := cli.Grant(ctx, 60)
		if err != nil {
			b.Fatal(err)
		}
		s, err := concurrency.NewSession(rawClient(b, eps), concurrency.WithTTL(60))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		id := fmt.Sprint(time.Now().UnixNano())
		m := concurrency.NewMutex(s, "/bench/interleaved-mutex/"+id)
		l := openLocker(b, srv.URL()+testPrefix)
		floorKey, lockKey := "/bench/interleaved-floor/"+id, "bench/interleaved/"+id
		var floor, mutex, dl []time.Duration
		for b.Loop() {
			t0 := time.Now()
			resp, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(floorKey), "=", 0)).
				Then(clientv3.OpPut(floorKey, "", clientv3.WithLease(lease.ID))).
				Commit()
			if err != nil || !resp.Succeeded {
				b.Fatal(err, resp.Succeeded)
			}
			if _, err := cli.Delete(ctx, floorKey); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := m.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			ls, err := l.TryAcquire(ctx, lockKey, dlock.WithTTL(time.Minute))
			if err != nil {
				b.Fatal(err)
			}
			if err := ls.Release(ctx); err != nil {
				b.Fatal(err)
			}
			t3 := time.Now()
			floor, mutex, dl = append(floor, t1.Sub(t0)), append(mutex, t2.Sub(t1)), append(dl, t3.Sub(t2))
		}
		f, m50, d := pct(floor, 50), pct(mutex, 50), pct(dl, 50)
		b.ReportMetric(float64(f.Microseconds()), "floor-p50-µs")
		b.ReportMetric(float64(m50.Microseconds()), "mutex-p50-µs")
		b.ReportMetric(float64(d.Microseconds()), "dlock-p50-µs")
		b.ReportMetric(float64(f)/float64(d), "dlock-vs-floor")
		b.ReportMetric(float64(m50)/float64(d), "dlock-vs-mutex")
	})

	b.Run("MutexHandoff8", func(b *testing.B) {
		const n = 8
		name := "/bench/mutex-handoff/" + fmt.Sprint(time.Now().UnixNano())
		mutexes := make([]*concurrency.Mutex, n)
		for i := range mutexes {
			s, err := concurrency.NewSession(rawClient(b, eps), concurrency.WithTTL(60))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			mutexes[i] = concurrency.NewMutex(s, name)
		}
		conformance.MeasureHandoff(b, n, func(ctx context.Context, i int) (func() error, error) {
			if err := mutexes[i].Lock(ctx); err != nil {
				return nil, err
			}
			return func() error { return mutexes[i].Unlock(ctx) }, nil
		})
	})
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

// plainLocker hides the Locker's type, so that dlock.AcquireAll takes its
// keys one at a time (it uses the driver's one-transaction acquire only on
// a Locker it made itself).
type plainLocker struct{ dlock.Locker }

// BenchmarkAcquireAll takes and releases 5 free keys with dlock.AcquireAll:
// in one transaction (atomic), and one key at a time (one-by-one), in turn.
func BenchmarkAcquireAll(b *testing.B) {
	srv := testenv.StartEtcd(b)
	l := openLocker(b, srv.URL()+testPrefix)
	ctx := context.Background()
	keys := []string{"all/1", "all/2", "all/3", "all/4", "all/5"}
	for _, c := range []struct {
		name string
		l    dlock.Locker
	}{{"atomic", l}, {"one-by-one", plainLocker{l}}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				set, err := dlock.AcquireAll(ctx, c.l, keys)
				if err != nil {
					b.Fatal(err)
				}
				if err := set.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
