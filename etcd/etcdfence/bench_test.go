package etcdfence_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock/etcd/etcdfence"
	"github.com/dlock-go/dlock/internal/testenv"
)

// BenchmarkWrite compares a fenced Put with a plain one on one key.
// Compare the two with benchstat; never assert on the numbers.
func BenchmarkWrite(b *testing.B) {
	srv := testenv.StartEtcd(b)
	cli, err := newClient(srv.Endpoint())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cli.Close() })
	ctx := context.Background()
	g := &etcdfence.Guard{Client: cli}
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			if _, err := cli.Put(ctx, "/bench/v", "v"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("guarded", func(b *testing.B) {
		for b.Loop() {
			if err := g.Put(ctx, 1, "bench", "/bench/v", "v"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
