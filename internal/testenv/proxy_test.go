package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// respConn is one raw RESP connection that stays open across commands.
type respConn struct {
	conn net.Conn
	rd   *bufio.Reader
}

func dialResp(t *testing.T, addr string) *respConn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, answerDeadline)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &respConn{conn: conn, rd: bufio.NewReader(conn)}
}

func (c *respConn) send(args ...string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if err := c.conn.SetWriteDeadline(time.Now().Add(answerDeadline)); err != nil {
		return err
	}
	_, err := io.WriteString(c.conn, b.String())
	return err
}

// read reads one simple-string, error or bulk reply within d.
func (c *respConn) read(d time.Duration) (string, error) {
	if err := c.conn.SetReadDeadline(time.Now().Add(d)); err != nil {
		return "", err
	}
	line, err := c.rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "+"), strings.HasPrefix(line, ":"):
		return line[1:], nil
	case strings.HasPrefix(line, "-"):
		return "", errors.New(line[1:])
	case line == "$-1":
		return "", errNil
	case strings.HasPrefix(line, "$"):
		var n int
		if _, err := fmt.Sscanf(line, "$%d", &n); err != nil {
			return "", fmt.Errorf("bad reply %q", line)
		}
		body := make([]byte, n+2)
		if _, err := io.ReadFull(c.rd, body); err != nil {
			return "", err
		}
		return string(body[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

func (c *respConn) do(t *testing.T, args ...string) string {
	t.Helper()
	if err := c.send(args...); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	got, err := c.read(answerDeadline)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return got
}

// clientNamed reports whether the server at addr lists a client connection
// named name (asked directly, not through a proxy).
func clientNamed(t *testing.T, addr, name string) bool {
	t.Helper()
	list, err := do(addr, answerDeadline, "CLIENT", "LIST")
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	return strings.Contains(list, " name="+name+" ")
}

// waitClientGone waits until the server no longer lists the client name: the
// server notices a closed connection on its own schedule, and says so only
// when asked.
func waitClientGone(t *testing.T, addr, name string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for clientNamed(t, addr, name) {
		if time.Now().After(deadline) {
			t.Fatalf("the server still lists client %s 5s after the cut", name)
		}
		time.Sleep(10 * time.Millisecond) // polling the server: no signal exists
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestProxyBlackholeCutHeal(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	if p.Addr() == r.Addr() || !strings.HasPrefix(p.Addr(), "127.0.0.1:") {
		t.Fatalf("proxy address %q", p.Addr())
	}

	c := dialResp(t, p.Addr())
	if got := c.do(t, "CLIENT", "SETNAME", "held"); got != "OK" {
		t.Fatalf("CLIENT SETNAME answered %q", got)
	}
	if got := c.do(t, "PING"); got != "PONG" {
		t.Fatalf("PING answered %q", got)
	}

	// Blackhole: the command is not answered, and the server still sees
	// the client connected.
	p.Blackhole(t)
	if err := c.send("SET", "k", "during-blackhole"); err != nil {
		t.Fatalf("send during blackhole: %v", err)
	}
	if got, err := c.read(300 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("read during blackhole: %q, %v; want a timeout", got, err)
	}
	if !clientNamed(t, r.Addr(), "held") {
		t.Fatal("the server lost the blackholed client")
	}
	if _, err := do(r.Addr(), answerDeadline, "GET", "k"); !errors.Is(err, errNil) {
		t.Fatalf("GET k directly: %v; the SET must not have passed", err)
	}
	// A new connection through the proxy is accepted but answers nothing.
	c2 := dialResp(t, p.Addr())
	if err := c2.send("PING"); err != nil {
		t.Fatalf("send on a new connection during blackhole: %v", err)
	}
	if got, err := c2.read(300 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("new connection during blackhole: %q, %v; want a timeout", got, err)
	}

	// Heal: the held command is delivered and answered, on the same
	// connections.
	p.Heal(t)
	if got, err := c.read(answerDeadline); err != nil || got != "OK" {
		t.Fatalf("held SET after heal: %q, %v; want OK", got, err)
	}
	if got, err := c2.read(answerDeadline); err != nil || got != "PONG" {
		t.Fatalf("held PING after heal: %q, %v; want PONG", got, err)
	}
	if got := c.do(t, "GET", "k"); got != "during-blackhole" {
		t.Fatalf("GET k after heal: %q", got)
	}

	// Cut: the client sees its connection close, the server drops the
	// client, and new connections are refused.
	p.Cut(t)
	if got, err := c.read(answerDeadline); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after cut: %q, %v; want EOF or a reset", got, err)
	}
	waitClientGone(t, r.Addr(), "held")
	if conn, err := net.DialTimeout("tcp", p.Addr(), answerDeadline); err == nil {
		_ = conn.Close()
		t.Fatal("the cut proxy accepted a connection")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial the cut proxy: %v; want connection refused", err)
	}

	// Heal: new connections work on the same address.
	p.Heal(t)
	c3 := dialResp(t, p.Addr())
	if got := c3.do(t, "GET", "k"); got != "during-blackhole" {
		t.Fatalf("GET k after healing the cut: %q", got)
	}
}

// A Cut while blackholed discards the held bytes: they never reach the
// server, even after Heal.
func TestProxyCutDropsHeldBytes(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	c := dialResp(t, p.Addr())
	if got := c.do(t, "CLIENT", "SETNAME", "dropped"); got != "OK" {
		t.Fatalf("CLIENT SETNAME answered %q", got)
	}
	p.Blackhole(t)
	if err := c.send("SET", "k", "lost"); err != nil {
		t.Fatalf("send during blackhole: %v", err)
	}
	p.Cut(t)
	if got, err := c.read(answerDeadline); err == nil || isTimeout(err) {
		t.Fatalf("read after cut: %q, %v; want the connection closed", got, err)
	}
	waitClientGone(t, r.Addr(), "dropped")
	p.Heal(t)
	if got, err := do(p.Addr(), answerDeadline, "GET", "k"); !errors.Is(err, errNil) {
		t.Fatalf("GET k after cut and heal: %q, %v; the held SET must have been dropped", got, err)
	}
}

// Proxies break and heal every member; calls in any order are safe, and the
// proxies stop with the test even when left broken.
func TestProxies(t *testing.T) {
	r1, r2 := StartRedis(t), StartRedis(t)
	ps := StartProxies(t, r1.Addr(), r2.Addr())
	if len(ps.Addrs()) != 2 || ps[0].Upstream() != r1.Addr() || ps[1].Upstream() != r2.Addr() {
		t.Fatalf("proxies %v", ps.Addrs())
	}
	conns := []*respConn{dialResp(t, ps[0].Addr()), dialResp(t, ps[1].Addr())}
	ps.Blackhole(t)
	ps.Blackhole(t) // idempotent
	for i, c := range conns {
		if err := c.send("PING"); err != nil {
			t.Fatal(err)
		}
		if got, err := c.read(200 * time.Millisecond); !isTimeout(err) {
			t.Fatalf("proxy %d during blackhole: %q, %v; want a timeout", i, got, err)
		}
	}
	ps.Heal(t)
	for i, c := range conns {
		if got, err := c.read(answerDeadline); err != nil || got != "PONG" {
			t.Fatalf("proxy %d after heal: %q, %v", i, got, err)
		}
	}
	ps.Cut(t)
	ps.Cut(t) // idempotent
	for i, c := range conns {
		if err := c.send("PING"); err == nil {
			if got, err := c.read(answerDeadline); err == nil {
				t.Fatalf("proxy %d after cut answered %q", i, got)
			}
		}
	}
	ps.Blackhole(t) // from Cut: listens again, blackholed
	c := dialResp(t, ps[1].Addr())
	if err := c.send("PING"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.read(200 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("blackholed after cut: %q, %v; want a timeout", got, err)
	}
	// Left blackholed: the cleanup must still stop everything (goleak in
	// TestMain checks that the pipeline goroutines ended).
}

// TestProxyReport: the report counts the connections the proxy accepted and
// those it closed at once because the server could not be dialed, naming
// the last dial error.
func TestProxyReport(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upstream := ln.Addr().String()
	_ = ln.Close() // nobody listens there: every dial is refused
	p := StartProxy(t, upstream)
	c, err := net.DialTimeout("tcp", p.Addr(), answerDeadline)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetReadDeadline(time.Now().Add(answerDeadline)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read through a proxy whose server is down: %d, %v; want EOF", n, err)
	}
	r := p.Report()
	if !strings.Contains(r, "1 connections accepted, 1 closed at once") || !strings.Contains(r, "connection refused") {
		t.Fatalf("report %q: want 1 accepted, 1 closed at once, the refused dial", r)
	}
	if got := (Proxies{p, p}).Report(); got != r+"\n"+r {
		t.Fatalf("Proxies.Report = %q", got)
	}
}
