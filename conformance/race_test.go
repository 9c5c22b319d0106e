package conformance

import (
	"runtime"
	"strings"
	"testing"
)

// zkRace is the race report a soak child on ZooKeeper printed in CI: the
// known race inside go-zookeeper (Conn.lastZxid).
const zkRace = `==================
WARNING: DATA RACE
Write at 0x00c0001b2000 by goroutine 1369:
  github.com/go-zookeeper/zk.(*Conn).recvLoop()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:849 +0x68c
  github.com/go-zookeeper/zk.(*Conn).loop.func2()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:474 +0x1c4

Previous read at 0x00c0001b2000 by goroutine 15:
  github.com/go-zookeeper/zk.(*Conn).sendSetWatches()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:614 +0x49d
  github.com/go-zookeeper/zk.(*Conn).loop()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:484 +0x54b
  github.com/go-zookeeper/zk.Connect.func1()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:224 +0x4a

Goroutine 1369 (running) created at:
  github.com/go-zookeeper/zk.(*Conn).loop()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:466 +0x53e

Goroutine 15 (running) created at:
  github.com/go-zookeeper/zk.Connect()
      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:223 +0x8e6
  github.com/dlock-go/dlock/zookeeper.Dial()
      /tmp/ciclone/main/zookeeper/zookeeper.go:202 +0xdef
==================
`

// A child's exit for a race is excused only when every race it reports is
// the known one inside go-zookeeper; a race with dlock's code in either
// access, another race beside it, or no report at all is not.
func TestOnlyKnownRaces(t *testing.T) {
	ours := strings.Replace(zkRace, "  github.com/go-zookeeper/zk.(*Conn).loop()\n      /root/go/pkg/mod/github.com/go-zookeeper/zk@v1.0.4/conn.go:484",
		"  github.com/dlock-go/dlock/zookeeper.(*Driver).Acquire()\n      /src/zookeeper/lock.go:10", 1)
	other := "==================\nWARNING: DATA RACE\nWrite at 0x1 by goroutine 7:\n  github.com/dlock-go/dlock.(*Lease).tick()\n      /src/lease.go:1\n\nPrevious read at 0x1 by goroutine 8:\n  github.com/dlock-go/dlock.(*Lease).Err()\n      /src/lease.go:2\n\nGoroutine 7 (running) created at:\n"
	for _, tc := range []struct {
		name   string
		stderr string
		want   bool
	}{
		{"the known go-zookeeper race", zkRace + "Found 1 data race(s)\n", true},
		{"twice", zkRace + zkRace, true},
		{"a dlock frame in an access", ours, false},
		{"the known one and another", zkRace + other, false},
		{"no race report", "panic: something else\n", false},
	} {
		if got := onlyKnownRaces(tc.stderr); got != tc.want {
			t.Errorf("%s: onlyKnownRaces = %v, want %v", tc.name, got, tc.want)
		}
	}
}

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
