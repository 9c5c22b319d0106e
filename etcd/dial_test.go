package etcd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcd"
	"github.com/dlock-go/dlock/internal/testenv"
)

// TestDialIgnoresPortableParams: Dial takes a DSN that dlock.Open takes,
// dlock's own parameters included, and names an unknown parameter in an
// error that says "invalid option" once.
func TestDialIgnoresPortableParams(t *testing.T) {
	srv := testenv.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn := srv.URL() + "/dial?ttl=5s&autorenew=false&label=a&reentrant=true"
	cli, prefix, err := etcd.Dial(ctx, dsn)
	if err != nil {
		t.Fatalf("Dial(%q): %v", dsn, err)
	}
	_ = cli.Close()
	if prefix == "" {
		t.Errorf("Dial(%q): empty prefix", dsn)
	}
	_, _, err = etcd.Dial(ctx, srv.URL()+"/dial?bogus=1")
	if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), `"bogus"`) {
		t.Fatalf("Dial with bogus=1: %v, want ErrInvalidOption naming it", err)
	}
	if n := strings.Count(err.Error(), "invalid option"); n != 1 {
		t.Errorf("Dial with bogus=1: %q says \"invalid option\" %d times, want once", err, n)
	}
}
