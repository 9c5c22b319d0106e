package conformance

import (
	"runtime"
	"strings"
	"testing"
)

// blockedInDlock parks until release is closed: a goroutine whose stack has a
// frame of dlock's code.
func blockedInDlock(parked chan<- struct{}, release <-chan struct{}) {
	close(parked)
	<-release
}

// The report of a hung child keeps its log's tail and the goroutines in
// dlock's code, as their functions without file lines, and leaves out the
// rest of the dump.
func TestDlockStacks(t *testing.T) {
	parked, release := make(chan struct{}), make(chan struct{})
	go blockedInDlock(parked, release)
	<-parked
	defer close(release)
	buf := make([]byte, 1<<20)
	dump := string(buf[:runtime.Stack(buf, true)])
	stderr := "the child's last log line\nSIGQUIT: quit\nPC=0x46e2c1 m=0 sigcode=0\n\n" + dump +
		"\n\ngoroutine 98 [select]:\nruntime.gopark(0x1)\n\t/go/src/runtime/proc.go:1 +0x1\ngithub.com/dlock-go/dlock.(*scheduler).loop(0xc0)\n\t/x/sched.go:1 +0x1" +
		"\n\ngoroutine 99 [select]:\nexample.com/other.loop(0x1)\n\t/x/other.go:10 +0x1\n"
	got := dlockStacks(stderr)
	for _, want := range []string{"the child's last log line", "conformance.blockedInDlock", "[chan receive]:", "created by testing.(*T).Run in goroutine",
		"goroutine 98 [select]:\ngithub.com/dlock-go/dlock.(*scheduler).loop\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("dlockStacks lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"\t", "example.com/other", "race_test.go:", "runtime.gopark"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("dlockStacks keeps %q:\n%s", unwanted, got)
		}
	}
	if plain := dlockStacks("no dump here"); plain != "no dump here" {
		t.Errorf("dlockStacks without a dump = %q, want the stderr as it was", plain)
	}
}
