package conformance

import (
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
