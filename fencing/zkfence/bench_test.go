package zkfence_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock/fencing/zkfence"
	"github.com/dlock-go/dlock/internal/testenv"
	"github.com/dlock-go/dlock/third_party/zk"
)

// BenchmarkWrite compares a fenced Set with a plain one on one node.
// Compare the two with benchstat; never assert on the numbers.
func BenchmarkWrite(b *testing.B) {
	srv := testenv.StartZooKeeper(b)
	conn, err := connect(srv.Addr())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(conn.Close)
	if _, err := conn.Create("/bench", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	g := &zkfence.Guard{Conn: conn}
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			if _, err := conn.Set("/bench", []byte("v"), -1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("guarded", func(b *testing.B) {
		for b.Loop() {
			if err := g.Set(ctx, 1, "bench", "/bench", []byte("v")); err != nil {
				b.Fatal(err)
			}
		}
	})
}
