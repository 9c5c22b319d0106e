// Package testenv starts real servers (Redis, etcd, ZooKeeper, PostgreSQL) as
// child processes of a test, on free 127.0.0.1 ports and
// in t.TempDir() data directories, and controls them: Kill, Pause (SIGSTOP),
// Resume (SIGCONT), Restart and Stop.
//
// Everything a helper starts is stopped by PID (never by name) in
// t.Cleanup, and every goroutine it starts has ended by the time that
// cleanup returns, so tests may use go.uber.org/goleak.
//
// StartProxy puts a breakable TCP proxy (Toxiproxy, used as a library) between
// clients and a server, for fault-injection tests. Apart from Toxiproxy, the
// package depends only on the standard library and package testing.
package testenv

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/dlock-go/dlock/internal/goroutines"
)

// extraBinDirs are searched after $PATH by Binary: Debian installs some
// server binaries in sbin directories that a non-login $PATH may lack.
var extraBinDirs = []string{"/usr/local/sbin", "/usr/sbin", "/sbin"}

// Binary returns the path of the executable name, looked up in $PATH and then
// in /usr/local/sbin, /usr/sbin and /sbin. A name containing a slash is used
// as a path as is.
//
// When the executable is missing, Binary skips the test with a message naming
// debianPackage and saying that scripts/install-test-deps.sh installs it.
// Under CI (the environment variable CI is "true") it fails the test with
// t.Fatalf instead, so that a CI machine without the server cannot pass by
// skipping.
func Binary(t testing.TB, name, debianPackage string) string {
	t.Helper()
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	if filepath.Base(name) == name {
		for _, dir := range extraBinDirs {
			if path, err := exec.LookPath(filepath.Join(dir, name)); err == nil {
				return path
			}
		}
	}
	const format = "testenv: %s not found: install Debian package %s (scripts/install-test-deps.sh installs it)"
	if os.Getenv("CI") == "true" {
		t.Fatalf(format+"; CI=true, so this fails instead of skipping", name, debianPackage)
	} else {
		t.Skipf(format, name, debianPackage)
	}
	return ""
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago: it
// listens on 127.0.0.1:0 and closes the listener. Another process may take
// the port before the caller binds it; the Start helpers of this package
// check the port again and retry on another port.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: no free port on 127.0.0.1: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatalf("testenv: closing listener on port %d: %v", port, err)
	}
	return port
}

// ErrAddrInUse is wrapped by the error of Process.Start when one of the
// configured ports was taken before the start, or when the child exited
// during startup saying "address already in use". Callers that chose the
// port themselves can retry on another one.
var ErrAddrInUse = errors.New("address already in use")

// portFree reports whether 127.0.0.1:port can be bound now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// SteadyGoroutines returns the number of goroutines once it has stayed the
// same for 100ms (or after 2s): goroutines.Steady, for tests that start
// servers too.
func SteadyGoroutines() int { return goroutines.Steady() }
