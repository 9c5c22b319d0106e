package testenv

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The jars of Debian's zookeeper package that a server needs on its class
// path (zookeeper.jar's manifest names the rest), and the logging jars that
// let it log to stdout.
var zooKeeperJars = []string{
	"/usr/share/java/zookeeper.jar",
	"/usr/share/java/slf4j-log4j12.jar",
	"/usr/share/java/log4j-1.2.jar",
}

const (
	// zooKeeperReadyTimeout bounds a ZooKeeper server's start: the JVM is slow
	// to start on a busy 2-core machine, and an ensemble member serves only
	// once a quorum has elected a leader.
	zooKeeperReadyTimeout = 60 * time.Second
	// zooKeeperProbeTimeout bounds one four-letter-word exchange.
	zooKeeperProbeTimeout = time.Second
)

// ZooKeeper is a ZooKeeper server the test owns, standalone (StartZooKeeper)
// or a member of an ensemble (StartZooKeeperEnsemble). The embedded Process
// controls it (Kill, Pause, Resume, Restart, Stop, PID, Alive); Restart keeps
// its ports and data directory, so a restarted member rejoins its ensemble
// with its data.
type ZooKeeper struct {
	*Process
	id   int // myid in an ensemble; 0 when standalone
	port int
}

// ZooKeeperOption configures StartZooKeeper and StartZooKeeperEnsemble.
type ZooKeeperOption func(*zooKeeperConfig)

type zooKeeperConfig struct {
	lines []string
}

// WithZooKeeperConfig appends raw zoo.cfg lines, such as "tickTime=2000",
// after those the Start helpers write; for a key given twice, the later line
// wins. Default: none.
func WithZooKeeperConfig(lines ...string) ZooKeeperOption {
	return func(c *zooKeeperConfig) { c.lines = append(c.lines, lines...) }
}

// zooKeeperBase is the zoo.cfg every server starts from. tickTime=500 makes
// sessions of 1–10s possible and failover take ~2s; forceSync=no keeps the
// transaction log off the disk's critical path (data still survives a Kill,
// from the page cache); the admin server would bind 0.0.0.0:8080.
var zooKeeperBase = []string{
	"tickTime=500",
	"initLimit=20",
	"syncLimit=4",
	"admin.enableServer=false",
	"4lw.commands.whitelist=*",
	"maxClientCnxns=0",
	"forceSync=no",
}

// StartZooKeeper starts a standalone ZooKeeper server (Debian package
// zookeeper, which pulls in a JRE; the test is skipped, or fails under
// CI=true, when java or the jars are missing) on a free 127.0.0.1 port with a
// new t.TempDir() as its data directory:
//
//	java -Xmx256m -cp zookeeper.jar:slf4j-log4j12.jar:log4j-1.2.jar \
//	    org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg
//
// with tickTime=500 (sessions of 1s to 10s), forceSync=no, the admin server
// off and every four-letter word allowed. It returns once the server answers
// "srvr" with "Mode: standalone" and "conf" with its own data directory, so a
// leftover server on the same port cannot pass for it. If the port is taken
// before the server binds it, it retries on another port, three attempts in
// all. The server logs to LogPath and is stopped in t.Cleanup.
func StartZooKeeper(t testing.TB, opts ...ZooKeeperOption) *ZooKeeper {
	t.Helper()
	java, cfg := zooKeeperPrereqs(t, opts)
	dir := t.TempDir()
	return startRetrying(t, "StartZooKeeper", func() (*ZooKeeper, error) {
		port := FreePort(t)
		z, err := newZooKeeper(t, java, dir, 0, port, []int{port}, nil, cfg)
		if err != nil {
			t.Fatalf("testenv: StartZooKeeper: %v", err)
		}
		if err := z.Start(); err != nil {
			return nil, err
		}
		return z, nil
	})
}

// ZooKeeperEnsemble is a ZooKeeper ensemble the test owns.
type ZooKeeperEnsemble struct {
	// Members are the servers, in myid order (Members[i] has myid i+1).
	Members []*ZooKeeper
}

// StartZooKeeperEnsemble starts an ensemble of n ZooKeeper servers (n ≥ 1,
// usually 3), each configured as StartZooKeeper does, with its own data
// directory and three free 127.0.0.1 ports (client, quorum, election), and
// returns once every member serves as leader or follower (~1.5s after the JVMs
// are up). If a port is taken before the server binds it, it retries the whole
// ensemble on new ports, three attempts in all. The servers are stopped in
// t.Cleanup.
func StartZooKeeperEnsemble(t testing.TB, n int, opts ...ZooKeeperOption) *ZooKeeperEnsemble {
	t.Helper()
	if n < 1 {
		t.Fatalf("testenv: StartZooKeeperEnsemble: %d members", n)
	}
	java, cfg := zooKeeperPrereqs(t, opts)
	return startRetrying(t, "StartZooKeeperEnsemble", func() (*ZooKeeperEnsemble, error) {
		ports := make([][3]int, n) // client, quorum, election
		servers := make([]string, n)
		for i := range ports {
			for j := range ports[i] {
				ports[i][j] = FreePort(t)
			}
			servers[i] = fmt.Sprintf("server.%d=127.0.0.1:%d:%d", i+1, ports[i][1], ports[i][2])
		}
		e := &ZooKeeperEnsemble{Members: make([]*ZooKeeper, n)}
		for i := range e.Members {
			z, err := newZooKeeper(t, java, t.TempDir(), i+1, ports[i][0], ports[i][:], servers, cfg)
			if err != nil {
				t.Fatalf("testenv: StartZooKeeperEnsemble: %v", err)
			}
			e.Members[i] = z
		}
		// A member is ready only once a quorum has formed: start them all at
		// once.
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, z := range e.Members {
			wg.Go(func() { errs[i] = z.Start() })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			for _, z := range e.Members {
				z.Stop()
			}
			return nil, err
		}
		return e, nil
	})
}

// zooKeeperPrereqs finds java and the jars, skipping (or, under CI=true,
// failing) the test like Binary when they are missing.
func zooKeeperPrereqs(t testing.TB, opts []ZooKeeperOption) (string, zooKeeperConfig) {
	t.Helper()
	java := Binary(t, "java", "zookeeper")
	for _, jar := range zooKeeperJars {
		if _, err := os.Stat(jar); err != nil {
			const format = "testenv: %s not found: install Debian package zookeeper (scripts/install-test-deps.sh installs it)"
			if os.Getenv("CI") == "true" {
				t.Fatalf(format+"; CI=true, so this fails instead of skipping", jar)
			} else {
				t.Skipf(format, jar)
			}
		}
	}
	var cfg zooKeeperConfig
	for _, o := range opts {
		o(&cfg)
	}
	return java, cfg
}

const zooKeeperLog4j = `log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1}: %m%n
`

// newZooKeeper writes dir/zoo.cfg (and dir/myid for an ensemble member) and
// returns the server's Process, not started.
func newZooKeeper(t testing.TB, java, dir string, id, port int, ports []int, servers []string, cfg zooKeeperConfig) (*ZooKeeper, error) {
	lines := append([]string(nil), zooKeeperBase...)
	lines = append(lines,
		"dataDir="+dir,
		"clientPort="+strconv.Itoa(port),
		"clientPortAddress=127.0.0.1",
	)
	lines = append(lines, servers...)
	lines = append(lines, cfg.lines...)
	cfgPath := filepath.Join(dir, "zoo.cfg")
	if err := os.WriteFile(cfgPath, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return nil, err
	}
	log4j := filepath.Join(dir, "log4j.properties")
	if err := os.WriteFile(log4j, []byte(zooKeeperLog4j), 0o644); err != nil {
		return nil, err
	}
	name := "zookeeper"
	wantModes := []string{"standalone"}
	if id > 0 {
		if err := os.WriteFile(filepath.Join(dir, "myid"), []byte(strconv.Itoa(id)+"\n"), 0o644); err != nil {
			return nil, err
		}
		name = fmt.Sprintf("zookeeper-%d", id)
		wantModes = []string{"leader", "follower"}
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p := NewProcess(t, ProcessConfig{
		Name: name,
		Path: java,
		Args: []string{
			"-Xmx256m", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
			"-Dlog4j.configuration=file:" + log4j,
			"-Dzookeeper.admin.enableServer=false",
			"-cp", strings.Join(zooKeeperJars, ":"),
			"org.apache.zookeeper.server.quorum.QuorumPeerMain", cfgPath,
		},
		Dir:           dir,
		Ports:         ports,
		ReadyTimeout:  zooKeeperReadyTimeout,
		ReadyInterval: 50 * time.Millisecond,
		StopGrace:     3 * time.Second,
		Ready: func(ctx context.Context, pid int) error {
			return zooKeeperReady(ctx, addr, dir, wantModes)
		},
	})
	return &ZooKeeper{Process: p, id: id, port: port}, nil
}

// zooKeeperReady returns nil if the server at addr serves in one of the
// modes and has dir as its data directory.
func zooKeeperReady(ctx context.Context, addr, dir string, modes []string) error {
	mode, err := zooKeeperMode(ctx, addr)
	if err != nil {
		return err
	}
	ok := false
	for _, m := range modes {
		ok = ok || m == mode
	}
	if !ok {
		return fmt.Errorf("%s serves as %s, want %s", addr, mode, strings.Join(modes, " or "))
	}
	conf, err := fourLetterWord(ctx, addr, "conf")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(conf, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "dataDir="); ok {
			if filepath.Clean(v) != filepath.Join(dir, "version-2") && filepath.Clean(v) != dir {
				return fmt.Errorf("%s is served from %s, not from the child's %s", addr, v, dir)
			}
			return nil
		}
	}
	return errors.New("conf reports no dataDir")
}

// zooKeeperMode asks addr "srvr" and returns its mode: "standalone",
// "leader" or "follower".
func zooKeeperMode(ctx context.Context, addr string) (string, error) {
	out, err := fourLetterWord(ctx, addr, "srvr")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(out, "\n") {
		if m, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	// e.g. "This ZooKeeper instance is not currently serving requests"
	return "", fmt.Errorf("%s: srvr answered %q", addr, strings.TrimSpace(out))
}

// fourLetterWord sends a four-letter-word command to addr and returns the
// whole answer (the server closes the connection after it).
func fourLetterWord(ctx context.Context, addr, cmd string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, zooKeeperProbeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			return "", err
		}
	}
	// Cut the exchange short when ctx is cancelled (the child exited).
	unblocked := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(unblocked)
		_ = conn.SetDeadline(time.Now())
	})
	defer func() {
		if !stop() {
			<-unblocked
		}
	}()
	if _, err := io.WriteString(conn, cmd); err != nil {
		return "", err
	}
	out, err := io.ReadAll(bufio.NewReader(conn))
	if err != nil {
		return "", err
	}
	return string(out), nil
}

// Port returns the server's client port on 127.0.0.1.
func (z *ZooKeeper) Port() int { return z.port }

// Addr returns the server's client address, "127.0.0.1:PORT".
func (z *ZooKeeper) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(z.port)) }

// ID returns the server's myid in its ensemble, or 0 for a standalone server.
func (z *ZooKeeper) ID() int { return z.id }

// URL returns a dlock DSN for the server with the given root path, such as
// "zk://127.0.0.1:PORT/dlock".
func (z *ZooKeeper) URL(root string) string { return "zk://" + z.Addr() + root }

// Mode asks the server "srvr" and returns its mode: "standalone", "leader"
// or "follower". It fails if the server does not answer within a second or
// does not serve (an ensemble member without a quorum).
func (z *ZooKeeper) Mode() (string, error) {
	return zooKeeperMode(context.Background(), z.Addr())
}

// WatchedPaths asks the server "wchp" and returns its answer: every path
// some session has a watch on, each followed by the watching sessions' ids
// on lines of their own. A test reads it to know that a client waiting for a
// node has set its watch.
func (z *ZooKeeper) WatchedPaths() (string, error) {
	return fourLetterWord(context.Background(), z.Addr(), "wchp")
}

// Addrs returns the members' client addresses.
func (e *ZooKeeperEnsemble) Addrs() []string {
	addrs := make([]string, len(e.Members))
	for i, z := range e.Members {
		addrs[i] = z.Addr()
	}
	return addrs
}

// URL returns a dlock DSN for the ensemble with the given root path, such as
// "zk://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/dlock".
func (e *ZooKeeperEnsemble) URL(root string) string {
	return "zk://" + strings.Join(e.Addrs(), ",") + root
}

// Leader waits until exactly one running member reports itself leader and
// every other running member follower, and returns the leader. It fails the
// test if that does not happen within 30s (an election after a leader's
// failure takes ~2s with tickTime=500).
func (e *ZooKeeperEnsemble) Leader(t testing.TB) *ZooKeeper {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for {
		var leader *ZooKeeper
		leaders, others := 0, 0
		var states []string
		for _, z := range e.Members {
			if !z.Alive() {
				states = append(states, fmt.Sprintf("%d: down", z.id))
				continue
			}
			m, err := z.Mode()
			if err != nil {
				m = err.Error()
			}
			states = append(states, fmt.Sprintf("%d: %s", z.id, m))
			switch m {
			case "leader":
				leaders++
				leader = z
			case "follower":
			default:
				others++
			}
		}
		if leaders == 1 && others == 0 {
			return leader
		}
		last = strings.Join(states, "; ")
		if time.Now().After(deadline) {
			t.Fatalf("testenv: no single ZooKeeper leader after 30s: %s", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ExpireZooKeeperSession makes the server at addr end the session sessionID,
// as if it had expired: it opens a connection that attaches to the session
// with its password (ZooKeeper lets a client move its session to another
// connection, which is how clients fail over) and closes the session from
// there. When it returns, the close has been committed: the session's
// ephemeral nodes are deleted, and the session's own client, when it next
// talks to a server, is told the session expired. timeout bounds the whole
// exchange.
//
// If the session's client reconnects while this runs, it may take the
// session back and the close fails: callers that need certainty keep the
// client from reconnecting meanwhile.
func ExpireZooKeeperSession(addr string, sessionID int64, password []byte, timeout time.Duration) error {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	// ConnectRequest and CloseSession in one write, so that nothing can come
	// between them on this connection.
	var req []byte
	req = appendZooKeeperConnect(req, sessionID, password, 10*time.Second)
	req = appendZooKeeperPacket(req, 1, -11, nil) // xid 1, closeSession
	if _, err := conn.Write(req); err != nil {
		return err
	}
	rd := bufio.NewReader(conn)
	id, _, _, err := readZooKeeperConnectResponse(rd)
	if err != nil {
		return fmt.Errorf("attach to session 0x%x: %w", sessionID, err)
	}
	if id == 0 {
		return fmt.Errorf("session 0x%x had already expired", sessionID)
	}
	xid, errCode, err := readZooKeeperReplyHeader(rd)
	if err != nil {
		return fmt.Errorf("close session 0x%x: %w", sessionID, err)
	}
	if xid != 1 || errCode != 0 {
		return fmt.Errorf("close session 0x%x: reply xid %d, error code %d", sessionID, xid, errCode)
	}
	return nil
}

// appendZooKeeperConnect appends a ConnectRequest: protocolVersion 0,
// lastZxidSeen 0, timeOut, sessionId, passwd, readOnly false.
func appendZooKeeperConnect(b []byte, sessionID int64, password []byte, timeout time.Duration) []byte {
	body := binary.BigEndian.AppendUint32(nil, 0)
	body = binary.BigEndian.AppendUint64(body, 0)
	body = binary.BigEndian.AppendUint32(body, uint32(timeout.Milliseconds()))
	body = binary.BigEndian.AppendUint64(body, uint64(sessionID))
	body = binary.BigEndian.AppendUint32(body, uint32(len(password)))
	body = append(body, password...)
	body = append(body, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...)
}

// appendZooKeeperPacket appends a request: length, xid, opcode, body.
func appendZooKeeperPacket(b []byte, xid, op int32, body []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(8+len(body)))
	b = binary.BigEndian.AppendUint32(b, uint32(xid))
	b = binary.BigEndian.AppendUint32(b, uint32(op))
	return append(b, body...)
}

// readZooKeeperFrame reads one length-prefixed packet.
func readZooKeeperFrame(rd io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(rd, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > 1<<20 {
		return nil, fmt.Errorf("reply of %d bytes", n)
	}
	body := make([]byte, n)
	_, err := io.ReadFull(rd, body)
	return body, err
}

// readZooKeeperConnectResponse reads a ConnectResponse; a session id of 0
// means the server refused the session as expired.
func readZooKeeperConnectResponse(rd io.Reader) (id int64, timeout time.Duration, password []byte, err error) {
	body, err := readZooKeeperFrame(rd)
	if err != nil {
		return 0, 0, nil, err
	}
	if len(body) < 20 {
		return 0, 0, nil, fmt.Errorf("short ConnectResponse (%d bytes)", len(body))
	}
	timeout = time.Duration(int32(binary.BigEndian.Uint32(body[4:8]))) * time.Millisecond
	id = int64(binary.BigEndian.Uint64(body[8:16]))
	n := int(binary.BigEndian.Uint32(body[16:20]))
	if n < 0 || 20+n > len(body) {
		return 0, 0, nil, errors.New("malformed ConnectResponse")
	}
	return id, timeout, body[20 : 20+n], nil
}

// readZooKeeperReplyHeader reads a reply and returns its xid and error code.
func readZooKeeperReplyHeader(rd io.Reader) (xid, errCode int32, err error) {
	body, err := readZooKeeperFrame(rd)
	if err != nil {
		return 0, 0, err
	}
	if len(body) < 16 {
		return 0, 0, fmt.Errorf("short reply (%d bytes)", len(body))
	}
	return int32(binary.BigEndian.Uint32(body[0:4])), int32(binary.BigEndian.Uint32(body[12:16])), nil
}

// Sessions asks the server "cons" and returns the ids of the sessions of
// its client connections (a connection that has not established a session
// yet is left out). It fails if the server does not answer within a second.
func (z *ZooKeeper) Sessions() ([]int64, error) {
	out, err := fourLetterWord(context.Background(), z.Addr(), "cons")
	if err != nil {
		return nil, err
	}
	// One line per connection: " /127.0.0.1:PORT[1](queued=0,...,sid=0x...,...)".
	var ids []int64
	for _, line := range strings.Split(out, "\n") {
		_, rest, ok := strings.Cut(line, "sid=0x")
		if !ok {
			continue
		}
		hex, _, _ := strings.Cut(rest, ",")
		hex = strings.TrimRight(hex, ")\r ")
		id, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: cons: bad session id in %q", z.Addr(), strings.TrimSpace(line))
		}
		ids = append(ids, int64(id))
	}
	return ids, nil
}
