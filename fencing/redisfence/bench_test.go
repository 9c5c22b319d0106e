package redisfence_test

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/fencing/redisfence"
	"github.com/dlock-go/dlock/internal/testenv"
)

// BenchmarkWrite compares a fenced SET with a plain one on one key.
// Compare the two with benchstat; never assert on the numbers.
func BenchmarkWrite(b *testing.B) {
	r := testenv.StartRedis(b)
	cli := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	b.Cleanup(func() { _ = cli.Close() })
	ctx := context.Background()
	g := &redisfence.Guard{Client: cli}
	key := redisfence.Key("bench", ":v")
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			if err := cli.Set(ctx, key, "v", 0).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("guarded", func(b *testing.B) {
		for b.Loop() {
			if err := g.Set(ctx, 1, "bench", key, "v", 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}
