package testenv

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// Proxy is a TCP proxy between clients and one server, started by StartProxy:
// Toxiproxy (github.com/Shopify/toxiproxy/v2) used as a library, in process,
// with no API server. It can break the path in two ways, Blackhole and Cut,
// and Heal it. Its methods are safe for concurrent use.
//
// The proxy dials the server when it accepts a client, so the server sees
// one connection per client connection, and sees it close when either the
// client or the proxy (Cut) closes it.
type Proxy struct {
	p        *toxiproxy.Proxy
	addr     string
	upstream string
	guard    *guardState

	mu    sync.Mutex // serializes Blackhole, Cut, Heal and the cleanup
	state proxyState
	hold  *holdState // the blackhole's state while it is in place
}

type proxyState int

const (
	proxyOpen proxyState = iota
	proxyBlackholed
	proxyCut
	proxyStopped
)

// proxyServer is the Toxiproxy "API server" that proxies need for their
// logger and metrics; no HTTP server is started. Its logger discards
// everything and it collects no metrics.
var proxyServer = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())

// proxySeq numbers proxies, to name them and their blackholes.
var proxySeq atomic.Int64

// StartProxy starts a Proxy on a free 127.0.0.1 port that forwards every
// connection to upstream ("host:port"), and stops it in t.Cleanup (closing
// every connection through it). It fails the test if it cannot listen.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	n := proxySeq.Add(1)
	p := toxiproxy.NewProxy(proxyServer, fmt.Sprintf("dlock-testenv-%d", n), "127.0.0.1:0", upstream)
	g := newGuardState(n)
	for _, dir := range []string{"upstream", "downstream"} {
		body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":{"id":%d}}`,
			"guard_"+dir, guardToxicType, dir, n)
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			g.release()
			t.Fatalf("testenv: StartProxy(%s): adding the %s guard: %v", upstream, dir, err)
		}
	}
	if err := p.Start(); err != nil {
		g.release()
		t.Fatalf("testenv: StartProxy(%s): %v", upstream, err)
	}
	// Start has rewritten p.Listen to the port it got; Heal after Cut
	// listens on that port again. Read it while no goroutine writes it.
	px := &Proxy{p: p, addr: p.Listen, upstream: upstream, guard: g}
	t.Cleanup(px.stop)
	return px
}

// Addr returns the address clients connect to, "127.0.0.1:PORT". It stays
// the same across Cut and Heal.
func (p *Proxy) Addr() string { return p.addr }

// Upstream returns the server address the proxy forwards to.
func (p *Proxy) Upstream() string { return p.upstream }

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
		p.restart(t)
	case proxyStopped:
		t.Fatalf("testenv: Blackhole: proxy %s is stopped", p.addr)
	}
	h := newHoldState()
	for _, dir := range []string{"upstream", "downstream"} {
		body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":{"id":%d}}`,
			"blackhole_"+dir, holdToxicType, dir, h.id)
		if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			h.release()
			p.removeToxics()
			t.Fatalf("testenv: Blackhole %s: adding the %s toxic: %v", p.addr, dir, err)
		}
	}
	p.hold = h
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
	p.close()
	p.state = proxyCut
}

// close stops the listener and closes every connection, dropping what a
// blackhole holds, and removes the blackhole.
func (p *Proxy) close() {
	if p.hold != nil {
		// The blackhole toxics now discard what they hold and read, so
		// that every pipeline goroutine can see its connection close.
		p.hold.drop()
	}
	p.p.Stop()
	if p.hold != nil {
		p.removeToxics()
		p.hold.release()
		p.hold = nil
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
		p.removeToxics()
		p.hold.release()
		p.hold = nil
	case proxyCut:
		p.restart(t)
	case proxyStopped:
		t.Fatalf("testenv: Heal: proxy %s is stopped", p.addr)
	}
	p.state = proxyOpen
}

// restart listens again after a Cut.
func (p *Proxy) restart(t testing.TB) {
	t.Helper()
	if err := p.p.Start(); err != nil {
		t.Fatalf("testenv: Heal: proxy %s cannot listen again: %v", p.addr, err)
	}
	p.state = proxyOpen
}

// removeToxics removes the blackhole toxics (those that exist).
func (p *Proxy) removeToxics() {
	for _, dir := range []string{"upstream", "downstream"} {
		// ErrToxicNotFound only, when adding failed half way.
		_ = p.p.Toxics.RemoveToxic(context.Background(), "blackhole_"+dir)
	}
}

// stop is the cleanup: it closes everything for good, and lets the guards
// discard what no writer will take any more, so that every pipeline
// goroutine ends.
func (p *Proxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != proxyStopped {
		p.guard.stop()
		p.close()
		p.guard.release()
		p.state = proxyStopped
	}
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

// holdToxicType is the Toxiproxy toxic type of a blackhole.
const holdToxicType = "dlock_testenv_hold"

func init() { toxics.Register(holdToxicType, new(holdToxic)) }

// holdToxic passes nothing and closes nothing: it does not read its input,
// so the toxic before it in the pipeline blocks, then the proxy stops
// reading the socket, and TCP flow control stops the sender. Removing it
// (Heal) lets the held bytes through. Toxiproxy's own timeout toxic with
// timeout 0 drops the bytes instead, and closes the connection when it is
// removed, which is not a partition that heals.
//
// Toxiproxy creates toxics from JSON, so the toxic finds its Proxy's state
// through the ID it is created with.
type holdToxic struct {
	ID int64 `json:"id"`
}

// Pipe holds the stream until the toxic is interrupted (removed), or, once
// the state's drop channel is closed (Cut), discards it until it ends.
func (h *holdToxic) Pipe(stub *toxics.ToxicStub) {
	st := lookupHoldState(h.ID)
	if st == nil { // released: the blackhole is being removed
		<-stub.Interrupt
		return
	}
	select {
	case <-stub.Interrupt:
		return
	case <-st.dropped:
	}
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
		}
	}
}

// holdState is shared by the two toxics of one blackhole.
type holdState struct {
	id      int64
	dropped chan struct{} // closed by drop
}

var holdStates sync.Map // int64 → *holdState

var holdSeq atomic.Int64

func newHoldState() *holdState {
	h := &holdState{id: holdSeq.Add(1), dropped: make(chan struct{})}
	holdStates.Store(h.id, h)
	return h
}

func lookupHoldState(id int64) *holdState {
	if v, ok := holdStates.Load(id); ok {
		return v.(*holdState)
	}
	return nil
}

func (h *holdState) drop()    { close(h.dropped) }
func (h *holdState) release() { holdStates.Delete(h.id) }

// guardToxicType is the Toxiproxy toxic type of a guard.
const guardToxicType = "dlock_testenv_guard"

func init() { toxics.Register(guardToxicType, new(guardToxic)) }

// guardToxic passes everything through, like Toxiproxy's hidden noop toxic,
// but never blocks for good. Every proxy has one in each direction, first in
// the chain after the noop toxic, so it is the stage that hands the data to
// the goroutine writing it out (or to a blackhole). That goroutine ends when
// its connection fails (a server that closed the connection while the
// client was still sending), and Toxiproxy's own stages then block forever
// on their next chunk: a goroutine leak, and a hang of the next Blackhole or
// Heal, which interrupts that stage and waits for it. The guard instead
// returns at once when interrupted, keeping the chunk it could not hand on
// for its next run (per-connection state), and once the proxy is stopped it
// discards everything until its input ends.
type guardToxic struct {
	ID int64 `json:"id"`
}

// guardPending is the per-connection state of a guard: the chunk it could
// not hand on before it was interrupted.
type guardPending struct {
	chunk *stream.StreamChunk
}

// NewState implements toxics.StatefulToxic.
func (g *guardToxic) NewState() interface{} { return new(guardPending) }

// Pipe implements toxics.Toxic.
func (g *guardToxic) Pipe(stub *toxics.ToxicStub) {
	pending, _ := stub.State.(*guardPending)
	if pending == nil {
		pending = new(guardPending)
	}
	var stopped <-chan struct{}
	if st := lookupGuardState(g.ID); st != nil {
		stopped = st.stopped
	} else {
		stopped = closedChan // released: the proxy is stopped
	}
	for {
		if c := pending.chunk; c != nil {
			select {
			case stub.Output <- c:
				pending.chunk = nil
			case <-stub.Interrupt:
				return // c stays pending
			case <-stopped:
				pending.chunk = nil
				g.drain(stub)
				return
			}
		}
		select {
		case <-stub.Interrupt:
			return
		case <-stopped:
			g.drain(stub)
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			pending.chunk = c
		}
	}
}

// drain discards the input until it ends (or the guard is interrupted).
func (g *guardToxic) drain(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
		}
	}
}

// closedChan is a closed channel.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// guardState is shared by the two guards of one proxy.
type guardState struct {
	id      int64
	stopped chan struct{} // closed by stop
}

var guardStates sync.Map // int64 → *guardState

func newGuardState(id int64) *guardState {
	g := &guardState{id: id, stopped: make(chan struct{})}
	guardStates.Store(id, g)
	return g
}

func lookupGuardState(id int64) *guardState {
	if v, ok := guardStates.Load(id); ok {
		return v.(*guardState)
	}
	return nil
}

func (g *guardState) stop()    { close(g.stopped) }
func (g *guardState) release() { guardStates.Delete(g.id) }
