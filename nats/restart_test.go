package nats_test

import (
	"context"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
)

// TestTokensSurviveEmptyStreamRestart: once every lock's key and marker has
// expired, the bucket's stream holds no message; after a restart of the
// server the next grant's token is still above every earlier one (the
// stream keeps its last sequence).
func TestTokensSurviveEmptyStreamRestart(t *testing.T) {
	srv := testenv.StartNATS(t)
	ctx := testCtx(t)
	const bucket = "dlock-restart"
	nc, err := natsgo.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// A bucket whose markers last one second, so the stream empties soon.
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Storage: jetstream.FileStorage, LimitMarkerTTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	dsn := srv.URL() + "/" + bucket
	l, err := dlock.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var last dlock.Token
	for _, k := range []string{"a", "b", "c"} {
		lease, err := l.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		last = max(last, lease.Token())
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = l.Close()
	stream, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			t.Logf("stream empty, last sequence %d, last token %d", info.State.LastSeq, last)
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("stream still holds %d messages", info.State.Msgs)
		}
		time.Sleep(100 * time.Millisecond) // polling the server: no signal to wait for
	}
	srv.Kill()
	srv.Restart()
	l, err = dlock.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	if lease.Token() <= last {
		t.Fatalf("token %d after a restart with an empty stream, want above %d", lease.Token(), last)
	}
	t.Logf("token %d after the restart", lease.Token())
}
