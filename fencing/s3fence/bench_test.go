package s3fence_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/dlock-go/dlock/fencing/s3fence"
)

// BenchmarkWrite compares a fenced Put (a HeadObject and a conditional
// PutObject) with a plain PutObject of the same bytes on one key. Compare the
// two with benchstat; never assert on the numbers.
func BenchmarkWrite(b *testing.B) {
	srv := startS3(b, "")
	c := srv.client(b)
	ctx := context.Background()
	g := &s3fence.Guard{Client: c, Bucket: bucket}
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("bench/plain"), Body: strings.NewReader("v")})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("guarded", func(b *testing.B) {
		for b.Loop() {
			if err := g.Put(ctx, "bench/guarded", 1, strings.NewReader("v")); err != nil {
				b.Fatal(err)
			}
		}
	})
}
