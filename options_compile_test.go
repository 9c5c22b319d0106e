package dlock_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// scopePrograms are small programs that place options; each bad one gives a
// Locker option where an acquire option belongs, or the reverse, and must not
// compile, with an error naming the misplaced option and the scope it lacks.
var scopePrograms = []struct {
	name string
	body string // the body of main; ctx, l and k are declared
	want string // the compiler's error must contain it ("" for a program that compiles)
}{
	{"observer_to_acquire", `_, _ = l.Acquire(ctx, k, dlock.WithObserver(nil))`,
		"cannot use dlock.WithObserver(nil) (value of interface type dlock.Option) as dlock.AcquireOption value in argument to l.Acquire"},
	{"logger_to_do", `_ = dlock.Do(ctx, l, k, func(context.Context, *dlock.Lease) error { return nil }, dlock.WithLogger(slog.Default()))`,
		"cannot use dlock.WithLogger(slog.Default()) (value of interface type dlock.Option) as dlock.AcquireOption value in argument to dlock.Do"},
	{"logkeys_to_acquireall", `_, _ = dlock.AcquireAll(ctx, l, []string{k}, dlock.WithLogKeys(false))`,
		"cannot use dlock.WithLogKeys(false) (value of interface type dlock.Option) as dlock.AcquireOption value in argument to dlock.AcquireAll"},
	{"shared_to_open", `_, _ = dlock.Open(ctx, "mem://x", mode.WithShared())`,
		"cannot use mode.WithShared() (value of interface type dlock.AcquireOption) as dlock.Option value in argument to dlock.Open"},
	{"permits_to_new", `_, _ = dlock.New(nil, mode.WithPermits(2))`,
		"cannot use mode.WithPermits(2) (value of interface type dlock.AcquireOption) as dlock.Option value in argument to dlock.New"},
	{"placed_right", `
		l, _ = dlock.Open(ctx, "mem://x", dlock.WithObserver(nil), dlock.WithLogger(slog.Default()), dlock.WithLogKeys(false), dlock.WithTTL(time.Second), dlock.WithReentrant())
		_, _ = l.Acquire(ctx, k, dlock.WithTTL(time.Second), dlock.WithLabel("x"), dlock.WithAnnounce(), mode.WithShared())
		_, _ = l.TryAcquire(ctx, k, dlock.WithAutoRenew(false), dlock.WithReleaseTimeout(time.Second), mode.WithPermits(2))
		_ = dlock.Do(ctx, l, k, func(context.Context, *dlock.Lease) error { return nil }, dlock.WithReentrant())
		_, _ = dlock.AcquireAll(ctx, l, []string{k}, dlock.WithTTL(time.Second))
		_, _ = dlock.TryAcquireAll(ctx, l, []string{k}, dlock.WithLabel("x"))
		var both dlock.LeaseOption = dlock.WithTTL(time.Second)
		var _ dlock.Option = both
		var _ dlock.AcquireOption = both`, ""},
}

// TestOptionScopesCompile: a Locker option (WithObserver, WithLogger,
// WithLogKeys) given to Acquire, Do or AcquireAll, and an acquire option
// (the shared and counted modes) given to Open or New, is a compile error
// that names the option; options placed where they belong compile. It builds
// the programs of scopePrograms with the go command, in a directory inside
// the module.
func TestOptionScopesCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs with the go command")
	}
	dir, err := os.MkdirTemp(".", "_optionscopes")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	args := []string{"build", "-o", os.DevNull}
	for _, p := range scopePrograms {
		src := `package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/mode"
)

var (
	_ = slog.Default
	_ = time.Second
	_ = mode.WithShared
)

func main() {
	ctx, k := context.Background(), "k"
	var l dlock.Locker
	` + p.body + `
	_, _, _ = ctx, k, l
}
`
		if err := os.MkdirAll(filepath.Join(dir, p.name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p.name, "main.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range scopePrograms {
		cmd := exec.Command("go", append(args, "./"+filepath.Join(dir, p.name))...)
		out, err := cmd.CombinedOutput()
		switch {
		case p.want == "" && err != nil:
			t.Errorf("%s: options placed where they belong do not compile: %v\n%s", p.name, err, out)
		case p.want == "":
		case err == nil:
			t.Errorf("%s: compiled; want the error %q", p.name, p.want)
		case !strings.Contains(string(out), p.want):
			t.Errorf("%s: the build failed without naming the option; want %q in\n%s", p.name, p.want, out)
		default:
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(line, p.want) {
					t.Logf("%s: %s", p.name, line)
				}
			}
		}
	}
}
