package testenv

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy between clients and one server, started by
// StartProxy, written on the standard library alone (a fault-injection
// library such as Toxiproxy would bring its metrics and logging stacks into
// the go.mod of dlock's root module, and so into every user's version
// selection). It can break the path in two ways, Blackhole and Cut, and Heal
// it. Its methods are safe for concurrent use.
//
// The proxy dials the server when it accepts a client, so the server sees
// one connection per client connection, and sees it close when either the
// client or the proxy (Cut) closes it.
type Proxy struct {
	addr     string
	upstream string
	wg       sync.WaitGroup // the accept loops and every link's pumps

	mu    sync.Mutex // serializes Blackhole, Cut, Heal, the cleanup and the state below
	state proxyState
	ln    net.Listener       // nil while Cut or stopped
	links map[*link]struct{} // the connections through the proxy
	open  chan struct{}      // closed while bytes flow; open (blocking) while blackholed

	accepted    int   // client connections accepted
	dialFailed  int   // of those, closed at once because the server could not be dialed
	lastDialErr error // the last such dial's error
}

type proxyState int

const (
	proxyOpen proxyState = iota
	proxyBlackholed
	proxyCut
	proxyStopped
)

// link is one client connection and the server connection dialed for it.
type link struct {
	client, server net.Conn
	once           sync.Once
	closed         chan struct{} // closed by close
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.closed)
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

// flowing is a closed channel: the open state of the gate.
var flowing = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// proxyDialTimeout bounds the dial to the server for one accepted client.
const proxyDialTimeout = 5 * time.Second

// StartProxy starts a Proxy on a free 127.0.0.1 port that forwards every
// connection to upstream ("host:port"), and stops it in t.Cleanup (closing
// every connection through it). It fails the test if it cannot listen.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: StartProxy(%s): %v", upstream, err)
	}
	p := &Proxy{addr: ln.Addr().String(), upstream: upstream, links: map[*link]struct{}{}, open: flowing}
	p.serve(ln)
	t.Cleanup(p.stop)
	return p
}

// serve runs an accept loop on ln; p.mu is held or p is not shared yet.
func (p *Proxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() { // owned by p: ends when ln is closed (Cut, stop)
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.DialTimeout("tcp", p.upstream, proxyDialTimeout)
			p.mu.Lock()
			p.accepted++
			if err != nil {
				p.dialFailed++
				p.lastDialErr = err
			}
			p.mu.Unlock()
			if err != nil {
				_ = c.Close() // the server is down: so is the path
				continue
			}
			l := &link{client: c, server: s, closed: make(chan struct{})}
			p.mu.Lock()
			if p.ln != ln { // Cut or stopped since the accept
				p.mu.Unlock()
				l.close()
				continue
			}
			p.links[l] = struct{}{}
			p.wg.Add(2)
			p.mu.Unlock()
			go p.pump(l, s, c) // owned by p, through l: ends when l closes
			go p.pump(l, c, s)
		}
	}()
}

// pump copies src to dst. Each chunk read waits at the gate before it is
// written, so a blackhole holds it (and, as the pump reads no more, TCP flow
// control stops the sender); the end of src is held the same way, then
// closes the link: each side sees the other close, as TCP would deliver it.
func (p *Proxy) pump(l *link, dst, src net.Conn) {
	defer p.wg.Done()
	defer p.forget(l)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass(l) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			p.pass(l) // a close is held by a blackhole too
			return
		}
	}
}

// pass waits until bytes may flow, and reports false if the link closed
// meanwhile (Cut, stop).
func (p *Proxy) pass(l *link) bool {
	for {
		p.mu.Lock()
		gate := p.open
		p.mu.Unlock()
		select {
		case <-l.closed:
			return false
		case <-gate:
			// The gate may have been replaced (a new Blackhole) between the
			// read above and now; look again unless it is still the same.
			p.mu.Lock()
			same := p.open == gate
			p.mu.Unlock()
			if same {
				return true
			}
		}
	}
}

// forget closes l and drops it from the proxy's set.
func (p *Proxy) forget(l *link) {
	l.close()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// Addr returns the address clients connect to, "127.0.0.1:PORT". It stays
// the same across Cut and Heal.
func (p *Proxy) Addr() string { return p.addr }

// Upstream returns the server address the proxy forwards to.
func (p *Proxy) Upstream() string { return p.upstream }

// Report says what the proxy saw, for a test's failure message: the client
// connections it accepted, and how many it closed at once because the
// server could not be dialed, with the last such error.
func (p *Proxy) Report() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := fmt.Sprintf("proxy %s → %s: %d connections accepted, %d closed at once as the server could not be dialed", p.addr, p.upstream, p.accepted, p.dialFailed)
	if p.lastDialErr != nil {
		r += fmt.Sprintf(" (last: %v)", p.lastDialErr)
	}
	return r
}

// Blackhole stops every byte both ways, on current connections and on new
// ones, without closing any: each side sees a silent peer, as in a network
// partition. The bytes sent meanwhile are held, not dropped (TCP flow control
// stops the senders once buffers fill), and are delivered after Heal, as
// TCP retransmission would deliver them; a Cut discards them instead. New
// connections are still accepted, and the proxy still dials the server for
// each (the server sees a new client that says nothing). Blackholing a
// blackholed proxy does nothing; blackholing a Cut proxy heals the Cut first.
func (p *Proxy) Blackhole(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.state {
	case proxyBlackholed:
		return
	case proxyCut:
		p.listenAgain(t, "Blackhole")
	case proxyStopped:
		t.Fatalf("testenv: Blackhole: proxy %s is stopped", p.addr)
	}
	p.open = make(chan struct{})
	p.state = proxyBlackholed
}

// Cut closes every current connection through the proxy, on both sides (the
// client and the server each see the other close), and refuses new ones
// (the proxy stops listening) until Heal. Bytes held by a Blackhole are
// discarded, never delivered. Cutting a Cut proxy does nothing.
func (p *Proxy) Cut(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.state {
	case proxyCut:
		return
	case proxyStopped:
		t.Fatalf("testenv: Cut: proxy %s is stopped", p.addr)
	}
	p.closeLocked()
	p.state = proxyCut
}

// closeLocked stops listening and closes every link, dropping what a
// blackhole holds; the gate is open again for whatever comes next.
func (p *Proxy) closeLocked() {
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for l := range p.links {
		l.close()
	}
	if p.open != flowing {
		close(p.open)
		p.open = flowing
	}
}

// Heal restores normal service: after Blackhole, the held bytes are
// delivered and current and new connections work again; after Cut, the
// proxy accepts connections again on the same address (it fails the test if
// the port was taken meanwhile). Healing an open proxy does nothing.
func (p *Proxy) Heal(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.state {
	case proxyBlackholed:
		close(p.open)
		p.open = flowing
	case proxyCut:
		p.listenAgain(t, "Heal")
	case proxyStopped:
		t.Fatalf("testenv: Heal: proxy %s is stopped", p.addr)
	}
	p.state = proxyOpen
}

// listenAgain listens on the proxy's address after a Cut; p.mu is held.
func (p *Proxy) listenAgain(t testing.TB, op string) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatalf("testenv: %s: proxy %s cannot listen again: %v", op, p.addr, err)
	}
	p.serve(ln)
	p.state = proxyOpen
}

// stop is the cleanup: it closes everything for good and waits for every
// goroutine of the proxy.
func (p *Proxy) stop() {
	p.mu.Lock()
	if p.state != proxyStopped {
		p.closeLocked()
		p.state = proxyStopped
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Proxies is a set of proxies broken and healed together: the path from one
// client to every server of a deployment. Its methods satisfy the
// conformance suite's Link interface.
type Proxies []*Proxy

// StartProxies starts one Proxy per upstream address, as StartProxy does.
func StartProxies(t testing.TB, upstreams ...string) Proxies {
	t.Helper()
	ps := make(Proxies, len(upstreams))
	for i, u := range upstreams {
		ps[i] = StartProxy(t, u)
	}
	return ps
}

// Addrs returns the proxies' addresses, in order.
func (ps Proxies) Addrs() []string {
	addrs := make([]string, len(ps))
	for i, p := range ps {
		addrs[i] = p.Addr()
	}
	return addrs
}

// Blackhole blackholes every proxy (see Proxy.Blackhole).
func (ps Proxies) Blackhole(t testing.TB) {
	t.Helper()
	for _, p := range ps {
		p.Blackhole(t)
	}
}

// Cut cuts every proxy (see Proxy.Cut).
func (ps Proxies) Cut(t testing.TB) {
	t.Helper()
	for _, p := range ps {
		p.Cut(t)
	}
}

// Heal heals every proxy (see Proxy.Heal).
func (ps Proxies) Heal(t testing.TB) {
	t.Helper()
	for _, p := range ps {
		p.Heal(t)
	}
}

// Report joins the proxies' reports (see Proxy.Report), one per line.
func (ps Proxies) Report() string {
	rs := make([]string, len(ps))
	for i, p := range ps {
		rs[i] = p.Report()
	}
	return strings.Join(rs, "\n")
}
