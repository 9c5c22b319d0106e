package s3fence_test

import (
	"context"
	"errors"
	"log"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fencing"
	"github.com/dlock-go/dlock/fencing/s3fence"
)

// A job that holds the lock "reports/daily" writes its report to a bucket
// through the guard: the server stores it only if no newer token has written
// the object since the guard compared the tokens. A holder whose lease was
// lost while a newer holder wrote is refused.
func ExampleGuard_Put() {
	ctx := context.Background()
	var client *s3.Client   // e.g. s3.NewFromConfig(cfg)
	var locker dlock.Locker // e.g. dlock.Open(ctx, "redis://localhost:6379/0")
	if client == nil || locker == nil {
		return // this example shows the calls; it has no server to run on
	}
	guard := s3fence.Guard{Client: client, Bucket: "reports"}
	err := dlock.Do(ctx, locker, "reports/daily", func(ctx context.Context, lease *dlock.Lease) error {
		return guard.Put(ctx, "daily/report.csv", lease.Token(), strings.NewReader("id,total\n1,42\n"))
	})
	if errors.Is(err, fencing.ErrStaleToken) {
		log.Print("a newer holder has written the report; this write was refused")
	}
}
