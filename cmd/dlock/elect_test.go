//go:build unix

package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testenv"
)

// TestElectAndLeader: dlock elect runs its command only while leading, with
// the term's token, the election and the value in its environment; dlock
// leader shows the leader (exit 0) or nobody (exit 1), and --watch follows a
// hand-over; a second candidate waits (or, with --no-wait, exits 75) while
// the first leads, and leads with a higher token once it resigns.
func TestElectAndLeader(t *testing.T) {
	t.Parallel()
	env := []string{"DLOCK_DSN=" + testenv.StartRedis(t).URL()}

	r := runCLI(t, env, "leader", "scheduler")
	r.expectCode(t, exitFailure)
	if r := runCLI(t, env, "leader", "-o", "json", "scheduler"); r.code != exitFailure || !strings.Contains(r.stdout, `"led": false`) {
		t.Errorf("dlock leader -o json with nobody leading: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "leader:    none") && !strings.Contains(r.stdout, "leader:") {
		t.Errorf("dlock leader with nobody leading printed %q", r.stdout)
	}

	watch := start(t, env, "leader", "--watch", "--interval", "20ms", "scheduler")
	expectPrefix(t, watch, "no leader")
	watchJSON := start(t, env, "leader", "--watch", "-o", "json", "--interval", "20ms", "scheduler")
	var seen struct {
		Election string     `json:"election"`
		Led      bool       `json:"led"`
		Time     *time.Time `json:"time"`
	}
	if line := watchJSON.nextLine(); json.Unmarshal([]byte(line), &seen) != nil || seen.Election != "scheduler" || seen.Led || seen.Time == nil {
		t.Errorf("dlock leader --watch -o json with nobody leading printed %q", line)
	}

	first := start(t, env, "elect", "--value", "host-a:8080", "scheduler", "--", "sh", "-c",
		`echo "$DLOCK_KEY $DLOCK_VALUE $DLOCK_TOKEN"; exec sleep 60`)
	line := expectPrefix(t, first, "scheduler host-a:8080 ")
	token := strings.Fields(line)[2]
	expectPrefix(t, watch, "leader host-a:8080")

	r = runCLI(t, env, "leader", "scheduler")
	r.expectCode(t, exitOK)
	for _, want := range []string{"host-a:8080", "token:", token} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dlock leader while host-a leads: %q lacks %q", r.stdout, want)
		}
	}
	// -o json: the same, for scripts.
	r = runCLI(t, env, "leader", "-o", "json", "scheduler")
	r.expectCode(t, exitOK)
	var v struct {
		Election string     `json:"election"`
		Led      bool       `json:"led"`
		Value    string     `json:"value"`
		Token    uint64     `json:"token"`
		Expires  *time.Time `json:"expires"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Election != "scheduler" || !v.Led || v.Value != "host-a:8080" || fmt.Sprint(v.Token) != token || v.Expires == nil {
		t.Errorf("dlock leader -o json while host-a leads (%v):\n%s%s", err, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "elect", "--no-wait", "--value", "host-b:8080", "scheduler", "--", "echo", "ran")
	r.expectCode(t, exitBusy)
	if r.stdout != "" || !strings.Contains(r.stderr, `the leadership of election "scheduler" is held by another owner`) {
		t.Errorf("elect --no-wait while another leads: stdout %q stderr %q", r.stdout, r.stderr)
	}

	second := start(t, env, "elect", "--value", "host-b:8080", "scheduler", "--", "sh", "-c", `echo "$DLOCK_VALUE $DLOCK_TOKEN"; sleep 1`)
	time.Sleep(300 * time.Millisecond) // let it campaign
	select {
	case l := <-second.lines:
		t.Fatalf("the second candidate ran (%q) while the first leads", l)
	default:
	}
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil { // the first leader's command ends
		t.Fatal(err)
	}
	line = expectPrefix(t, second, "host-b:8080 ")
	if next := strings.Fields(line)[1]; len(next) < len(token) || (len(next) == len(token) && next <= token) {
		t.Errorf("the second term's token %s is not above the first's %s", next, token)
	}
	expectPrefix(t, watch, "leader host-b:8080")
	if code := second.wait(10 * time.Second); code != 0 {
		t.Errorf("second candidate: exit %d\n%s", code, second.stderr)
	}
	expectPrefix(t, watch, "no leader")
}

// expectPrefix waits for b to print a line starting with prefix, or
// containing it after a tab (dlock leader --watch starts lines with a time),
// and returns the line.
func expectPrefix(t *testing.T, b *background, prefix string) string {
	t.Helper()
	return b.expectMatch(prefix, func(l string) bool {
		return strings.HasPrefix(l, prefix) || strings.Contains(l, "\t"+prefix)
	})
}
