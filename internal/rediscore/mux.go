package rediscore

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/backend"
)

// healthInterval is how long the pub/sub reader waits for traffic before it
// pings the server, to keep the connection alive and notice a dead one.
const healthInterval = 30 * time.Second

// confirmInterval is how often the reader pings while a subscription is not
// yet confirmed, so that one made while the connection was broken is
// confirmed soon after it comes back.
const confirmInterval = 250 * time.Millisecond

// Mux shares one pub/sub connection to one Redis server (or Cluster) among
// all the waiting Acquire calls of a driver. Subscriptions are
// reference-counted per channel: the first waiter on a channel subscribes,
// the last one to leave unsubscribes.
//
// Two goroutines own the connection, started with the first subscription and
// stopped by Close: a writer, which sends SUBSCRIBE, UNSUBSCRIBE and PING in
// the order they were asked for (so an UNSUBSCRIBE can never overtake the
// SUBSCRIBE that a later waiter of the same channel needs), and a reader,
// which dispatches release messages to waiters.
//
// A subscription is known to be active when the server answers a PING sent
// after the SUBSCRIBE: pings carry a sequence number, and replies arrive in
// order, so the pong of ping n confirms every SUBSCRIBE written before ping n
// was allocated.
//
// Its methods are safe for concurrent use.
type Mux struct {
	client    goredis.UniversalClient
	errClosed error           // returned by Subscribe after Close
	ctx       context.Context // cancelled by Close, for the writer's network calls
	cancel    context.CancelFunc
	quit      chan struct{} // closed by Close
	kick      chan struct{} // buffered(1): ops were queued
	wg        sync.WaitGroup

	mu      sync.Mutex
	ps      *goredis.PubSub // nil until the first subscription
	chans   map[string]*chanState
	ops     []muxOp
	pingSeq uint64 // the last ping sequence number allocated
	closed  bool
}

// chanState is one subscribed channel and the calls waiting on it.
type chanState struct {
	name    string
	waiters []*Waiter // in arrival order; the first is woken by a message

	confirmed  bool
	subscribed bool   // the writer has sent SUBSCRIBE
	after      uint64 // pings with a greater sequence number were sent after SUBSCRIBE
}

// Waiter is one Acquire call waiting on one channel of one Mux.
type Waiter struct {
	st       *chanState
	id       string // a fair-mode waiter's name in the queue; "" otherwise
	observer bool   // woken by every message, and never takes one from a waiter
	shared   bool   // waits for a shared hold (SubscribeShared)
	wake     chan<- struct{}
	ready    chan<- struct{}
	handoff  atomic.Pointer[Handoff] // set by a hand-off message naming id
}

// Handoff is what a fair-mode release tells the waiter it handed the lock
// to (package redis, fair_release.lua): the lock is the waiter's already,
// with the lease TTL it asked for.
type Handoff struct {
	Token    uint64 // the grant's fencing token
	ServerUS int64  // the server's time when it handed the lock over, in µs
}

// ParseHandoff reads a hand-off message, "!<token> <server µs> <waiter>".
func ParseHandoff(payload string) (h Handoff, waiter string, ok bool) {
	rest, found := strings.CutPrefix(payload, "!")
	if !found {
		return h, "", false
	}
	tok, rest, _ := strings.Cut(rest, " ")
	now, waiter, _ := strings.Cut(rest, " ")
	var err1, err2 error
	h.Token, err1 = strconv.ParseUint(tok, 10, 64)
	h.ServerUS, err2 = strconv.ParseInt(now, 10, 64)
	if err1 != nil || err2 != nil || waiter == "" {
		return Handoff{}, "", false
	}
	return h, waiter, true
}

// TakeHandoff returns the hand-off made to w since the last call, if any.
func (w *Waiter) TakeHandoff() (Handoff, bool) {
	h := w.handoff.Swap(nil)
	if h == nil {
		return Handoff{}, false
	}
	return *h, true
}

type opKind int

const (
	opSubscribe opKind = iota
	opUnsubscribe
	opPing
)

type muxOp struct {
	kind opKind
	st   *chanState
}

// NewMux returns a Mux over client. It opens its pub/sub connection, and
// starts its two goroutines, only when the first waiter subscribes. After
// Close, Subscribe returns errClosed.
func NewMux(client goredis.UniversalClient, errClosed error) *Mux {
	ctx, cancel := context.WithCancel(context.Background())
	return &Mux{
		client:    client,
		errClosed: errClosed,
		ctx:       ctx,
		cancel:    cancel,
		quit:      make(chan struct{}),
		kick:      make(chan struct{}, 1),
		chans:     map[string]*chanState{},
	}
}

// Subscribe registers a waiter on channel, subscribing to it if this is its
// first waiter. The Mux signals the waiter by a send on wake, which never
// blocks (so wake should be buffered), when a release message is meant for
// it; and by one non-blocking send on ready once the subscription is
// confirmed (at once if it already is). Several waiters, on one Mux or on
// many, may share wake and ready channels. The waiter must be handed back to
// Unsubscribe.
func (m *Mux) Subscribe(channel string, wake, ready chan<- struct{}) (*Waiter, error) {
	return m.SubscribeAs(channel, "", wake, ready)
}

// SubscribeAs is Subscribe for a waiter named id in a fair queue: a message
// whose payload is id wakes it, and only it; a message naming another waiter
// wakes no one here; an empty message wakes the first waiter, as for
// Subscribe.
func (m *Mux) SubscribeAs(channel, id string, wake, ready chan<- struct{}) (*Waiter, error) {
	return m.subscribe(channel, id, false, false, wake, ready)
}

// SubscribeShared is Subscribe for a waiter of a shared hold. A release
// message wakes the first waiter of each kind, shared and exclusive: a
// shared waiter first in line may be refused (a waiting writer's mark keeps
// it out) where an exclusive one behind it would be granted.
func (m *Mux) SubscribeShared(channel string, wake, ready chan<- struct{}) (*Waiter, error) {
	return m.subscribe(channel, "", false, true, wake, ready)
}

// Observe is Subscribe for a follower that is not waiting for the lock
// (backend.Watcher): every message on channel wakes it, besides the waiter
// the message is for, and it never takes a message from a waiter.
func (m *Mux) Observe(channel string, wake, ready chan<- struct{}) (*Waiter, error) {
	return m.subscribe(channel, "", true, false, wake, ready)
}

func (m *Mux) subscribe(channel, id string, observer, shared bool, wake, ready chan<- struct{}) (*Waiter, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, m.errClosed
	}
	if m.ps == nil {
		m.ps = m.client.Subscribe(m.ctx)
		m.wg.Add(2)
		go m.writeLoop(m.ps)
		go m.readLoop(m.ps)
	}
	st := m.chans[channel]
	if st == nil {
		st = &chanState{name: channel}
		m.chans[channel] = st
		m.enqueueLocked(muxOp{kind: opSubscribe, st: st})
	}
	w := &Waiter{st: st, id: id, observer: observer, shared: shared, wake: wake, ready: ready}
	st.waiters = append(st.waiters, w)
	if st.confirmed {
		signal(ready)
	}
	return w, nil
}

// Unsubscribe removes w. If w leaves without the lock (granted is false) and
// others wait on the channel, the next one is woken in case w had taken a
// release message meant for whoever could use it: the next of w's kind
// (shared or not), or else the first.
func (m *Mux) Unsubscribe(w *Waiter, granted bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := w.st
	if i := slices.Index(st.waiters, w); i >= 0 {
		st.waiters = slices.Delete(st.waiters, i, i+1)
	}
	if len(st.waiters) > 0 {
		if !granted && !w.observer {
			next := firstOf(st.waiters, w.shared)
			if next == nil {
				next = firstWaiter(st.waiters)
			}
			if next != nil {
				signal(next.wake)
			}
		}
		return
	}
	if m.chans[st.name] == st {
		delete(m.chans, st.name)
		if !m.closed {
			m.enqueueLocked(muxOp{kind: opUnsubscribe, st: st})
		}
	}
}

func (m *Mux) enqueueLocked(op muxOp) {
	m.ops = append(m.ops, op)
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// signal sends on c without blocking.
func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Done returns a channel closed when Close is called: waiters still
// registered should give up.
func (m *Mux) Done() <-chan struct{} { return m.quit }

// Close stops both goroutines and closes the pub/sub connection, and waits
// for the goroutines to end. Waiters still registered see Done closed. A
// second Close does nothing.
func (m *Mux) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	ps := m.ps
	close(m.quit)
	m.mu.Unlock()

	m.cancel()
	if ps != nil {
		_ = ps.Close() // unblocks the reader
	}
	m.wg.Wait()
}

func (m *Mux) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// writeLoop sends queued subscription changes, in order, then one PING to
// confirm them.
func (m *Mux) writeLoop(ps *goredis.PubSub) {
	defer m.wg.Done()
	for {
		select {
		case <-m.kick:
		case <-m.quit:
			return
		}
		m.mu.Lock()
		ops := m.ops
		m.ops = nil
		m.mu.Unlock()

		ping := false
		for _, op := range ops {
			switch op.kind {
			case opSubscribe:
				// On error go-redis still records the channel and subscribes
				// to it again when it reconnects; the reader then asks for a
				// new ping, whose pong confirms it.
				_ = ps.Subscribe(m.ctx, op.st.name)
				m.mu.Lock()
				op.st.after = m.pingSeq
				op.st.subscribed = true
				m.mu.Unlock()
				ping = true
			case opUnsubscribe:
				_ = ps.Unsubscribe(m.ctx, op.st.name)
			case opPing:
				ping = true
			}
		}
		if ping {
			m.mu.Lock()
			m.pingSeq++
			seq := m.pingSeq
			m.mu.Unlock()
			_ = ps.Ping(m.ctx, strconv.FormatUint(seq, 10))
		}
	}
}

// readLoop dispatches what the server sends on the pub/sub connection. After
// a connection error (go-redis reconnects and resubscribes by itself) it asks
// for a ping to confirm the subscriptions on the new connection, and once the
// server answers again it wakes every waiter, since release messages may have
// been lost meanwhile.
func (m *Mux) readLoop(ps *goredis.PubSub) {
	defer m.wg.Done()
	backoff := backend.Backoff{Min: 10 * time.Millisecond, Max: time.Second}
	var pause *time.Timer
	defer func() {
		if pause != nil {
			pause.Stop()
		}
	}()
	broken := false
	for {
		wait := healthInterval
		if m.unconfirmed() {
			wait = confirmInterval
		}
		msg, err := ps.ReceiveTimeout(m.ctx, wait)
		if err != nil {
			if m.isClosed() {
				return
			}
			if isTimeout(err) {
				m.requestPing()
				continue
			}
			broken = true
			m.requestPing()
			if pause == nil {
				pause = time.NewTimer(backoff.Next())
			} else {
				pause.Reset(backoff.Next())
			}
			select {
			case <-pause.C:
			case <-m.quit:
				return
			}
			continue
		}
		backoff.Reset()
		if broken {
			broken = false
			m.wakeAll()
		}
		switch msg := msg.(type) {
		case *goredis.Message:
			m.dispatch(msg.Channel, msg.Payload)
		case *goredis.Pong:
			if seq, err := strconv.ParseUint(msg.Payload, 10, 64); err == nil {
				m.confirm(seq)
			}
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (m *Mux) requestPing() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.enqueueLocked(muxOp{kind: opPing})
	}
}

// dispatch wakes the first waiter on channel of each kind (exclusive,
// shared), or, if the message names a waiter or hands it the lock (fair
// mode), that waiter if it is here. One waiter of each kind per process is
// enough: if it takes the lock, its release wakes the next; if it leaves
// without it, or takes a shared hold beside which the next may be granted,
// Unsubscribe passes the wake-up on. Waiters in other processes get the
// message on their own connections.
func (m *Mux) dispatch(channel, payload string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.chans[channel]
	if st == nil || len(st.waiters) == 0 {
		return
	}
	for _, w := range st.waiters {
		if w.observer {
			signal(w.wake)
		}
	}
	if payload == GrantMessage {
		return // for followers only
	}
	if payload == WakeAllMessage {
		for _, w := range st.waiters {
			if !w.observer {
				signal(w.wake)
			}
		}
		return
	}
	if payload == "" {
		// The first waiter of each kind (see SubscribeShared).
		for _, shared := range []bool{false, true} {
			if first := firstOf(st.waiters, shared); first != nil {
				signal(first.wake)
			}
		}
		return
	}
	id := payload
	h, handedTo, handed := ParseHandoff(payload)
	if handed {
		id = handedTo
	}
	for _, w := range st.waiters {
		if !w.observer && w.id == id {
			if handed {
				w.handoff.Store(&h)
			}
			signal(w.wake)
			return
		}
	}
}

// GrantMessage is what the acquire scripts publish on the release channel when
// they grant the lock: it wakes followers (Mux.Observe), never waiters.
const GrantMessage = "+"

// WakeAllMessage is what the shared-lock script publishes on the release
// channel when the last shared holder leaves or a waiting writer gives up:
// it wakes every waiter on the channel, not just the first (a waiting writer
// and the shared waiters behind it may share a process, and each needs the
// news).
const WakeAllMessage = "*"

// firstWaiter is the first of ws that waits for the lock (not an observer).
func firstWaiter(ws []*Waiter) *Waiter {
	for _, w := range ws {
		if !w.observer {
			return w
		}
	}
	return nil
}

// firstOf is the first of ws that waits for a shared hold if shared is
// set, for the lock itself if not.
func firstOf(ws []*Waiter, shared bool) *Waiter {
	for _, w := range ws {
		if !w.observer && w.shared == shared {
			return w
		}
	}
	return nil
}

// unconfirmed reports whether a subscription waits for a ping to confirm it.
func (m *Mux) unconfirmed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, st := range m.chans {
		if !st.confirmed {
			return true
		}
	}
	return false
}

// confirm marks active every subscription sent before ping seq.
func (m *Mux) confirm(seq uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, st := range m.chans {
		if st.subscribed && !st.confirmed && seq > st.after {
			st.confirmed = true
			for _, w := range st.waiters {
				signal(w.ready)
			}
		}
	}
}

func (m *Mux) wakeAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, st := range m.chans {
		for _, w := range st.waiters {
			signal(w.wake)
		}
	}
}
