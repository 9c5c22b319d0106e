package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// NATSServerVersion is the version of the module github.com/nats-io/nats-server/v2
// that NATSServerBinary builds: Debian's nats-server (2.9) predates the
// per-message TTLs the nats driver needs (2.11).
const NATSServerVersion = "v2.15.2"

// NATSServerEnv names the environment variable that, when set, gives the
// path of the nats-server binary to use instead of the one NATSServerBinary
// builds.
const NATSServerEnv = "DLOCK_NATS_SERVER"

// natsBuild serializes the build within the test binary; the rename into
// place serializes it across test binaries.
var natsBuild sync.Mutex

// NATSServerBinary returns the path of a nats-server binary: $DLOCK_NATS_SERVER
// if set, else NATSServerVersion built once with `go install` (about 20s on 2
// cores) into the user's cache directory, dlock-testenv/nats-server-VERSION/
// under os.UserCacheDir(), and reused by later runs. When it cannot be built
// (no go command, no module proxy) the test is skipped, or fails under
// CI=true, as Binary does for a missing package.
func NATSServerBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(NATSServerEnv); p != "" {
		return p
	}
	natsBuild.Lock()
	defer natsBuild.Unlock()
	cache, err := os.UserCacheDir()
	if err != nil {
		natsMissing(t, err)
		return ""
	}
	dir := filepath.Join(cache, "dlock-testenv", "nats-server-"+NATSServerVersion)
	bin := filepath.Join(dir, "nats-server")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if err := buildNATSServer(dir, bin); err != nil {
		natsMissing(t, err)
		return ""
	}
	return bin
}

// buildNATSServer runs go install into a new directory beside bin and renames
// the binary into place, so that a concurrent build in another test binary
// never leaves a half-written file at bin.
func buildNATSServer(dir, bin string) error {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command(goCmd, "install", "github.com/nats-io/nats-server/v2@"+NATSServerVersion)
	cmd.Dir = tmp
	// A module outside any workspace: the test's own go.work must not apply.
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOWORK=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go install nats-server@%s: %w\n%s", NATSServerVersion, err, out)
	}
	return os.Rename(filepath.Join(tmp, "nats-server"), bin)
}

func natsMissing(t testing.TB, err error) {
	t.Helper()
	const format = "testenv: no nats-server %s (set %s, or let the test build it with go install): %v"
	if os.Getenv("CI") == "true" {
		t.Fatalf(format+"; CI=true, so this fails instead of skipping", NATSServerVersion, NATSServerEnv, err)
	} else {
		t.Skipf(format, NATSServerVersion, NATSServerEnv, err)
	}
}

// NATS is one nats-server the test owns, with JetStream enabled, started by
// StartNATS or as part of StartNATSCluster. The embedded Process controls it;
// Restart keeps its ports and store directory.
type NATS struct {
	*Process
	name        string
	port        int
	monitorPort int
	clusterPort int
}

// NATSCluster is a JetStream cluster started by StartNATSCluster.
type NATSCluster struct {
	// Members are the cluster's servers, named n0, n1, ….
	Members []*NATS
}

// StartNATS starts a single nats-server (NATSServerBinary) with JetStream on
// free 127.0.0.1 client and monitoring ports, its store in a new t.TempDir():
//
//	nats-server -n n0 -a 127.0.0.1 -p P -m M -js -sd D/n0
//
// It returns once /healthz on the monitoring port answers ok and the client
// port's listening socket belongs to the child, retrying on other ports when
// one was taken (three attempts), and fails the test otherwise. The server is
// stopped in t.Cleanup.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	return StartNATSCluster(t, 1).Members[0]
}

// StartNATSCluster starts n nats-servers (n ≥ 1), each as StartNATS
// describes; with n > 1 they form the JetStream cluster "dlock" (routes
// between all of them), and it returns once every member's /healthz answers
// ok, which needs a JetStream meta leader.
func StartNATSCluster(t testing.TB, n int) *NATSCluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("testenv: StartNATSCluster: %d members", n)
	}
	bin := NATSServerBinary(t)
	dir := t.TempDir()
	attempt := 0
	return startRetrying(t, "StartNATSCluster", func() (*NATSCluster, error) {
		attempt++
		return startNATSCluster(t, bin, dir, attempt-1, n)
	})
}

func startNATSCluster(t testing.TB, bin, dir string, attempt, n int) (*NATSCluster, error) {
	c := &NATSCluster{Members: make([]*NATS, n)}
	used := map[int]bool{}
	port := func() int {
		for {
			if p := FreePort(t); !used[p] {
				used[p] = true
				return p
			}
		}
	}
	var routes []string
	for i := range c.Members {
		m := &NATS{name: "n" + strconv.Itoa(i), port: port(), monitorPort: port()}
		if n > 1 {
			m.clusterPort = port()
			routes = append(routes, "nats://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(m.clusterPort)))
		}
		c.Members[i] = m
	}
	for _, m := range c.Members {
		args := []string{
			"-n", m.name,
			"-a", "127.0.0.1",
			"-p", strconv.Itoa(m.port),
			"-m", strconv.Itoa(m.monitorPort),
			"-js",
			// A new store per attempt: a half-started member of a failed
			// attempt leaves state naming the old peers.
			"-sd", filepath.Join(dir, fmt.Sprintf("%s.%d", m.name, attempt)),
		}
		ports := []int{m.port, m.monitorPort}
		if n > 1 {
			args = append(args,
				"--cluster_name", "dlock",
				"--cluster", "nats://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(m.clusterPort)),
				"--routes", strings.Join(routes, ","))
			ports = append(ports, m.clusterPort)
		}
		m.Process = NewProcess(t, ProcessConfig{
			Name:      "nats-" + m.name,
			Path:      bin,
			Args:      args,
			Dir:       dir,
			Ports:     ports,
			Ready:     m.ready,
			StopGrace: natsStopGrace,
			// A member is ready once the cluster has a meta leader, which
			// takes every member's start: slow on a busy machine.
			ReadyTimeout: 30 * time.Second,
		})
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range c.Members {
		wg.Go(func() { errs[i] = m.Start() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, m := range c.Members {
			m.Kill()
		}
		return nil, err
	}
	return c, nil
}

// natsStopGrace is how long Stop waits after SIGTERM before SIGKILL; the
// data is throwaway.
const natsStopGrace = 3 * time.Second

// natsClient has no keep-alive connections, so no transport goroutine
// outlives a probe.
var natsClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// ready checks that the server serves: /healthz answers 200 (JetStream up,
// and in a cluster a meta leader known) and the client port's listening
// socket belongs to pid.
func (m *NATS) ready(ctx context.Context, pid int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(m.monitorPort))+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := natsClient.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/healthz answered %s", resp.Status)
	}
	return listenerOwnedBy(pid, m.port)
}

// Name returns the server's name ("n0", "n1", …).
func (m *NATS) Name() string { return m.name }

// Endpoint returns the server's client address, "127.0.0.1:PORT".
func (m *NATS) Endpoint() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port)) }

// MonitorEndpoint returns the server's HTTP monitoring address (/varz,
// /healthz), "127.0.0.1:PORT".
func (m *NATS) MonitorEndpoint() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.monitorPort))
}

// URL returns the server's client URL, "nats://127.0.0.1:PORT", as nats.go
// and dlock's DSN (with a bucket as its path) take it.
func (m *NATS) URL() string { return "nats://" + m.Endpoint() }

// URL returns the client URLs of all members, comma-separated, as nats.go's
// Connect takes them: "nats://127.0.0.1:P1,nats://127.0.0.1:P2,…".
func (c *NATSCluster) URL() string {
	urls := make([]string, len(c.Members))
	for i, m := range c.Members {
		urls[i] = m.URL()
	}
	return strings.Join(urls, ",")
}

// Endpoints returns the client addresses of all members.
func (c *NATSCluster) Endpoints() []string {
	eps := make([]string, len(c.Members))
	for i, m := range c.Members {
		eps[i] = m.Endpoint()
	}
	return eps
}
