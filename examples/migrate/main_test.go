package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestExample runs the program as docs/MIGRATING.md and its package doc say,
// against a real Redis and a real etcd, twice on the same servers.
func TestExample(t *testing.T) {
	r := testenv.StartRedis(t)
	e := testenv.StartEtcd(t)
	bin := filepath.Join(t.TempDir(), "migrate")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		out, err := exec.CommandContext(ctx, bin, "-redis", r.URL(), "-etcd", e.URL()).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("example: %v\n%s", err, out)
		}
		for _, want := range []string{
			"new-only   refused before the switch",
			"switched: new tokens = base",
			"rejected: ",
			"balance 100 after 10 honest deposits",
		} {
			if !strings.Contains(string(out), want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		t.Logf("\n%s", out)
	}
}
