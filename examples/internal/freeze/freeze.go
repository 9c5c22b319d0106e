// Package freeze forwards TCP connections to a server and can stop them all
// at once, so that an example can show a client whose process is paused: a
// frozen client sends and receives nothing, and the server sees it fall
// silent.
package freeze

import (
	"net"
	"sync"
)

// Proxy forwards each connection made to Addr to its upstream address.
type Proxy struct {
	Addr string // 127.0.0.1:PORT, to dial instead of the upstream

	ln       net.Listener
	upstream string
	wg       sync.WaitGroup

	mu     sync.Mutex
	gate   chan struct{} // closed while not frozen
	conns  map[net.Conn]struct{}
	closed bool
}

// Start listens on a free loopback port and forwards to upstream
// ("host:port").
func Start(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, upstream: upstream, gate: open, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Freeze stops every byte in both directions, on open connections and on
// new ones, until Thaw.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already frozen
	}
}

// Thaw lets the bytes held by Freeze through.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// Close thaws the proxy, closes its listener and connections, and waits for
// its goroutines to end.
func (p *Proxy) Close() error {
	p.Thaw()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, u) {
			return
		}
		p.wg.Go(func() { p.pipe(u, c) })
		p.wg.Go(func() { p.pipe(c, u) })
	}
}

// track registers c and u for Close; it closes them and reports false if the
// proxy is closed.
func (p *Proxy) track(c, u net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		_ = u.Close()
		return false
	}
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	return true
}

// pipe copies src to dst, holding each chunk while the proxy is frozen; when
// either side ends it closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.wait() // a frozen process reads nothing, and sees no close either
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// wait returns when the proxy is not frozen.
func (p *Proxy) wait() {
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	<-gate
}
