package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Etcd is one etcd member the test owns, started by StartEtcd (a single-node
// cluster) or as part of StartEtcdCluster. The embedded Process controls it
// (Kill, Pause, Resume, Restart, Stop, PID, Alive); Restart keeps its ports and
// data directory, so a restarted member rejoins its cluster with its data.
type Etcd struct {
	*Process
	name       string
	clientPort int
	peerPort   int
}

// EtcdOption configures StartEtcd and StartEtcdCluster.
type EtcdOption func(*etcdConfig)

type etcdConfig struct {
	args []string
}

// WithEtcdArgs appends raw etcd arguments, such as "--heartbeat-interval=50",
// after those StartEtcd sets; later arguments win. Default: none, so the
// server runs with etcd's defaults (heartbeat 100ms, election timeout 1s, which
// make the shortest lease TTL 2s).
func WithEtcdArgs(args ...string) EtcdOption {
	return func(c *etcdConfig) { c.args = append(c.args, args...) }
}

// StartEtcd starts a single-member etcd cluster (the etcd binary of Debian
// package etcd-server; the test is skipped, or fails under CI=true, when it
// is missing) on free 127.0.0.1 client and peer ports, with its data in a new
// t.TempDir():
//
//	etcd --name n0 --data-dir D/n0.etcd --logger=zap
//	     --listen-client-urls http://127.0.0.1:C --advertise-client-urls http://127.0.0.1:C
//	     --listen-peer-urls http://127.0.0.1:P --initial-advertise-peer-urls http://127.0.0.1:P
//	     --initial-cluster n0=http://127.0.0.1:P --initial-cluster-state new
//
// It returns once /health on the client port reports a healthy member and the
// listening socket belongs to the child, so a leftover server on the same port
// cannot pass for it. If a port is taken before the server binds it, it retries
// on other ports, three attempts in all. It fails the test, quoting the
// server's output, if the member is not ready within 10s. The server is
// stopped in t.Cleanup (SIGTERM, then SIGKILL after 3s: the data is
// throwaway).
func StartEtcd(t testing.TB, opts ...EtcdOption) *Etcd {
	t.Helper()
	return StartEtcdCluster(t, 1, opts...).Members[0]
}

// EtcdCluster is a cluster of etcd members started by StartEtcdCluster.
type EtcdCluster struct {
	// Members are the cluster's members, named n0, n1, ….
	Members []*Etcd
}

// StartEtcdCluster starts an n-member etcd cluster (n ≥ 1; 3 tolerates the
// loss of one member) as n child processes, each as StartEtcd describes, with
// --initial-cluster naming all of them. The members start concurrently, and
// StartEtcdCluster returns once every one reports itself healthy, which needs
// an elected leader. It retries on other ports when a port was taken before
// the start, three attempts in all, and fails the test otherwise.
func StartEtcdCluster(t testing.TB, n int, opts ...EtcdOption) *EtcdCluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("testenv: StartEtcdCluster: %d members", n)
	}
	var cfg etcdConfig
	for _, o := range opts {
		o(&cfg)
	}
	bin := Binary(t, "etcd", "etcd-server")
	dir := t.TempDir()
	attempt := 0
	return startRetrying(t, "StartEtcdCluster", func() (*EtcdCluster, error) {
		attempt++
		return startEtcdCluster(t, bin, dir, attempt-1, n, cfg)
	})
}

func startEtcdCluster(t testing.TB, bin, dir string, attempt, n int, cfg etcdConfig) (*EtcdCluster, error) {
	c := &EtcdCluster{Members: make([]*Etcd, n)}
	used := map[int]bool{}
	port := func() int {
		for {
			// FreePort may hand out a port twice in a row; each must be distinct.
			if p := FreePort(t); !used[p] {
				used[p] = true
				return p
			}
		}
	}
	var initial []string
	for i := range c.Members {
		m := &Etcd{name: "n" + strconv.Itoa(i), clientPort: port(), peerPort: port()}
		c.Members[i] = m
		initial = append(initial, m.name+"="+m.peerURL())
	}
	for _, m := range c.Members {
		clientURL := "http://" + m.Endpoint()
		args := []string{
			"--name", m.name,
			// A new data directory per attempt: a half-started member of a
			// failed attempt leaves a WAL naming the old peers.
			"--data-dir", filepath.Join(dir, fmt.Sprintf("%s.%d.etcd", m.name, attempt)),
			"--logger=zap",
			"--listen-client-urls", clientURL,
			"--advertise-client-urls", clientURL,
			"--listen-peer-urls", m.peerURL(),
			"--initial-advertise-peer-urls", m.peerURL(),
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", "dlock-testenv",
		}
		args = append(args, cfg.args...)
		m.Process = NewProcess(t, ProcessConfig{
			Name:      "etcd-" + m.name,
			Path:      bin,
			Args:      args,
			Dir:       dir,
			Ports:     []int{m.clientPort, m.peerPort},
			Ready:     m.ready,
			StopGrace: etcdStopGrace,
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

// etcdStopGrace is how long Stop waits after SIGTERM: etcd usually exits in
// 1.5–2s, once in 9s when a whole cluster stopped at once; the data is
// throwaway, so SIGKILL after a short grace is fine.
const etcdStopGrace = 3 * time.Second

// Name returns the member's name ("n0", "n1", …).
func (e *Etcd) Name() string { return e.name }

// ClientPort returns the member's client port on 127.0.0.1.
func (e *Etcd) ClientPort() int { return e.clientPort }

// Endpoint returns the member's client address, "127.0.0.1:PORT", as
// clientv3.Config.Endpoints and etcdctl --endpoints take it.
func (e *Etcd) Endpoint() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(e.clientPort)) }

// URL returns the member's dlock DSN without a path, "etcd://127.0.0.1:PORT".
func (e *Etcd) URL() string { return "etcd://" + e.Endpoint() }

func (e *Etcd) peerURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(e.peerPort))
}

// Endpoints returns the client addresses of all members.
func (c *EtcdCluster) Endpoints() []string {
	eps := make([]string, len(c.Members))
	for i, m := range c.Members {
		eps[i] = m.Endpoint()
	}
	return eps
}

// URL returns the cluster's dlock DSN without a path,
// "etcd://127.0.0.1:P1,127.0.0.1:P2,…".
func (c *EtcdCluster) URL() string { return "etcd://" + strings.Join(c.Endpoints(), ",") }

// Leader returns the member that a live member reports as the leader, asking
// the members in turn until one knows, for up to 10s. It fails the test if
// none does.
func (c *EtcdCluster) Leader(t testing.TB) *Etcd {
	t.Helper()
	deadline := time.Now().Add(DefaultReadyTimeout)
	var lastErr error
	for {
		for _, m := range c.Members {
			if !m.Alive() {
				continue
			}
			st, err := etcdStatus(context.Background(), m.Endpoint())
			if err != nil {
				lastErr = err
				continue
			}
			if st.Leader == "" || st.Leader == "0" {
				lastErr = fmt.Errorf("member %s knows no leader", m.name)
				continue
			}
			for _, l := range c.Members {
				if l.Alive() && l.memberID() == st.Leader {
					return l
				}
			}
			lastErr = fmt.Errorf("member %s names leader %s, not a live member", m.name, st.Leader)
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: no leader among the etcd members after %v: %v", DefaultReadyTimeout, lastErr)
		}
		time.Sleep(50 * time.Millisecond) // polling a server: no signal to wait for
	}
}

// memberID returns the member's id as the status API spells it, or "" if the
// member does not answer.
func (e *Etcd) memberID() string {
	st, err := etcdStatus(context.Background(), e.Endpoint())
	if err != nil {
		return ""
	}
	return st.Header.MemberID
}

// etcdProbeTimeout bounds one readiness or status probe.
const etcdProbeTimeout = time.Second

// ready checks that the member serves: /health says true (a leader is known
// and the member answers reads) and the client port's listening socket belongs
// to pid.
func (e *Etcd) ready(ctx context.Context, pid int) error {
	ctx, cancel := context.WithTimeout(ctx, etcdProbeTimeout)
	defer cancel()
	body, err := etcdHTTP(ctx, http.MethodGet, e.Endpoint(), "/health", nil)
	if err != nil {
		return err
	}
	var h struct {
		Health string `json:"health"`
	}
	if err := json.Unmarshal(body, &h); err != nil {
		return fmt.Errorf("/health answered %q", body)
	}
	if h.Health != "true" {
		return fmt.Errorf("/health answered %s", bytes.TrimSpace(body))
	}
	return listenerOwnedBy(pid, e.clientPort)
}

// etcdStatusReply is the part of the status API's answer we read. The gRPC
// gateway spells uint64 fields as JSON strings.
type etcdStatusReply struct {
	Header struct {
		MemberID string `json:"member_id"`
	} `json:"header"`
	Leader string `json:"leader"`
}

func etcdStatus(ctx context.Context, endpoint string) (*etcdStatusReply, error) {
	ctx, cancel := context.WithTimeout(ctx, etcdProbeTimeout)
	defer cancel()
	body, err := etcdHTTP(ctx, http.MethodPost, endpoint, "/v3/maintenance/status", []byte("{}"))
	if err != nil {
		return nil, err
	}
	var st etcdStatusReply
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("status of %s: %w", endpoint, err)
	}
	return &st, nil
}

// etcdClient has no keep-alive connections, so no transport goroutine
// outlives a probe.
var etcdClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// etcdHTTP sends one request to etcd's HTTP API (its JSON gateway) and
// returns the body of a 200 answer.
func etcdHTTP(ctx context.Context, method, endpoint, path string, body []byte) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+endpoint+path, rd)
	if err != nil {
		return nil, err
	}
	resp, err := etcdClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

// listenerOwnedBy returns nil if the TCP socket listening on 127.0.0.1:port
// is open in process pid (Linux: it matches the socket's inode in
// /proc/net/tcp against pid's file descriptors).
func listenerOwnedBy(pid, port int) error {
	inode, err := listenerInode(port)
	if err != nil {
		return err
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return err
	}
	want := "socket:[" + inode + "]"
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && l == want {
			return nil
		}
	}
	return fmt.Errorf("127.0.0.1:%d is served by another process, not by the child PID %d", port, pid)
}

// listenerInode returns the inode of the socket listening on 127.0.0.1:port,
// from /proc/net/tcp.
func listenerInode(port int) (string, error) {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return "", err
	}
	// local_address is hex "0100007F:PORT" for 127.0.0.1; state 0A is LISTEN.
	local := fmt.Sprintf("0100007F:%04X", port)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) >= 10 && f[1] == local && f[3] == "0A" {
			return f[9], nil
		}
	}
	return "", fmt.Errorf("nothing listens on 127.0.0.1:%d", port)
}
