package s3fence_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/dlock-go/dlock/fencing/s3fence"
)

// BenchmarkGuards measures what the guard adds to a write, as bench's
// BenchmarkGuards does for the other guards (whose S3 server this module
// keeps to itself): on one fakes3 (in memory), one client, a new value each
// write, Guard.Put with a current token ("guarded": HeadObject, then a
// conditional PutObject) against a plain write ("plain"), the two
// interleaved round by round in a shuffled order. The plain write is a
// PutObject ("put"), or a PutObject with If-Match on the ETag its previous
// put returned ("conditional-put": the server compares, one round trip). It
// reports plain.ns/op, guarded.ns/op (means) and guarded/plain; compare
// runs with benchstat, never assert on the numbers.
func BenchmarkGuards(b *testing.B) {
	b.Run("s3", func(b *testing.B) {
		c := startS3(b, "").client(b)
		g := &s3fence.Guard{Client: c, Bucket: bucket}
		n := 0
		value := func() string { n++; return "v" + strconv.Itoa(n) }
		guarded := func(ctx context.Context) error {
			return g.Put(ctx, "bench/guarded", 1, strings.NewReader(value()))
		}
		put := func(ctx context.Context, key string, ifMatch *string) (*string, error) {
			out, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key),
				Body: strings.NewReader(value()), IfMatch: ifMatch})
			if err != nil {
				return nil, err
			}
			if out.ETag == nil {
				return nil, errors.New("PutObject returned no ETag")
			}
			return out.ETag, nil
		}
		var etag *string // the conditional put's last ETag
		for _, w := range []struct {
			name  string
			plain func(context.Context) error
		}{
			{"put", func(ctx context.Context) error { _, err := put(ctx, "bench/plain", nil); return err }},
			{"conditional-put", func(ctx context.Context) error {
				var err error
				if etag == nil {
					etag, err = put(ctx, "bench/conditional", nil)
					return err
				}
				etag, err = put(ctx, "bench/conditional", etag)
				return err
			}},
		} {
			b.Run(w.name, func(b *testing.B) {
				ctx := context.Background()
				fs := []func(context.Context) error{w.plain, guarded}
				for i, f := range fs { // warm-up; the first conditional put sets etag
					if err := f(ctx); err != nil {
						b.Fatalf("warm-up write %d: %v", i, err)
					}
				}
				var totals [2]time.Duration
				order := []int{0, 1}
				rng := rand.New(rand.NewPCG(1, 2))
				b.ResetTimer()
				for range b.N {
					rng.Shuffle(2, func(i, j int) { order[i], order[j] = order[j], order[i] })
					for _, i := range order {
						start := time.Now()
						if err := fs[i](ctx); err != nil {
							b.Fatalf("write %d: %v", i, err)
						}
						totals[i] += time.Since(start)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(totals[0].Nanoseconds())/float64(b.N), "plain.ns/op")
				b.ReportMetric(float64(totals[1].Nanoseconds())/float64(b.N), "guarded.ns/op")
				b.ReportMetric(float64(totals[1])/float64(totals[0]), "guarded/plain")
			})
		}
	})
}
