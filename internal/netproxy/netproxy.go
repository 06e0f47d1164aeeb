// Package netproxy is a TCP proxy for tests that cut a client off from a server the way a network
// partition does: Freeze stops forwarding in both directions and closes nothing, so neither peer
// sees a FIN or an RST. It can also delay what the server sends, like a slow link or a loaded
// server. (faults/proxy_test.go has a fuller proxy for the broker fault scenarios.)
package netproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards connections on Addr to a target.
type Proxy struct {
	Addr string

	mu       sync.Mutex
	delay    time.Duration
	frozen   chan struct{} // closed by Freeze
	done     chan struct{} // closed at the end of the test
	conns    []net.Conn
	accepted int
	once     sync.Once

	responses atomic.Int64 // chunks the server sent that were passed on
	held      atomic.Int64 // chunks the server sent that a delay holds back now
}

// New listens on a free local port and forwards to target until the test ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), frozen: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() {
		ln.Close()
		close(p.done)
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.accepted++
			p.mu.Unlock()
			go p.pipe(client, server, true)
			go p.pipe(server, client, false)
		}
	}()
	return p
}

// Freeze stops forwarding on every connection, current and new, for the rest of the test, and
// closes none: the peers see a silent network.
func (p *Proxy) Freeze() { p.once.Do(func() { close(p.frozen) }) }

// Cut closes every connection open now, both ways, like a server or a load balancer dropping
// them; new connections are forwarded as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Accepted counts the connections accepted so far.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Responses counts the chunks the servers sent that were passed on: a test waits for it to grow to
// know that a client's request (a check, a query) was answered, instead of sleeping.
func (p *Proxy) Responses() int64 { return p.responses.Load() }

// Held counts the chunks the servers sent that DelayResponses holds back now: a test waits for it
// to be positive to know that a request is in flight and its answer delayed.
func (p *Proxy) Held() int64 { return p.held.Load() }

// DelayResponses holds every chunk the server sends for d before passing it on; 0 ends the delay.
func (p *Proxy) DelayResponses(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// hold waits d, counted in Held while it lasts; false when the test ended first.
func (p *Proxy) hold(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	p.held.Add(1)
	defer p.held.Add(-1)
	select {
	case <-time.After(d):
		return true
	case <-p.done:
		return false
	}
}

// pipe copies src to dst until either fails. Once frozen it holds what it read and waits for the
// end of the test, keeping both connections open.
func (p *Proxy) pipe(dst, src net.Conn, fromServer bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if fromServer && n > 0 {
			p.mu.Lock()
			d := p.delay
			p.mu.Unlock()
			if !p.hold(d) {
				return
			}
		}
		select {
		case <-p.frozen:
			<-p.done
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if fromServer {
				p.responses.Add(1)
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}
