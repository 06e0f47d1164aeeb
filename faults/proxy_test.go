package faults

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// proxy forwards TCP connections to a target and can misbehave the ways a network does: stall
// (stop forwarding without closing anything, like a hung broker or a black-holed route), throttle,
// reset every connection (RST), or refuse new ones (down, like a stopped broker).
type proxy struct {
	addr, target string

	mu      sync.Mutex
	ln      net.Listener
	stalled chan struct{} // non-nil while stalled; closed by Resume
	rate    int           // bytes per second per direction of each connection; 0 = unlimited
	links   map[*link]struct{}
	closed  bool
}

// link is one proxied connection pair.
type link struct {
	client, server net.Conn
	done           chan struct{}
	once           sync.Once
}

// close ends both sides; with reset, the kernel sends RST instead of FIN.
func (l *link) close(reset bool) {
	l.once.Do(func() {
		close(l.done)
		for _, c := range []net.Conn{l.client, l.server} {
			if tc, ok := c.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		}
	})
}

// newProxy listens on addr ("127.0.0.1:0" for any port) and forwards to target; it is closed at
// the end of the test.
func newProxy(t testing.TB, addr, target string) *proxy {
	t.Helper()
	p := &proxy{target: target, links: make(map[*link]struct{})}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.ln = ln
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.handle(c)
		}
	}()
}

func (p *proxy) handle(client net.Conn) {
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		// Like the broker itself: nobody listening means the connection goes away.
		if tc, ok := client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		client.Close()
		return
	}
	l := &link{client: client, server: server, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.close(true)
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	go p.pipe(l, server, client)
	p.pipe(l, client, server)
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// pipe copies src to dst chunk by chunk, holding each chunk while the proxy is stalled.
func (p *proxy) pipe(l *link, dst, src net.Conn) {
	defer l.close(false)
	buf := make([]byte, 16<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate(l) {
				return
			}
			if wait := p.delay(n); wait > 0 {
				select {
				case <-time.After(wait):
				case <-l.done:
					return
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a reset: end both sides, as a real hop would
		}
	}
}

// gate blocks while the proxy is stalled; false means the link was closed meanwhile.
func (p *proxy) gate(l *link) bool {
	for {
		p.mu.Lock()
		stalled := p.stalled
		p.mu.Unlock()
		if stalled == nil {
			return true
		}
		select {
		case <-stalled:
		case <-l.done:
			return false
		}
	}
}

func (p *proxy) delay(n int) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rate <= 0 {
		return 0
	}
	return time.Duration(float64(n) / float64(p.rate) * float64(time.Second))
}

// Stall stops forwarding in both directions on every connection, current and new, without closing
// anything: the peers see a silent network.
func (p *proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// Resume forwards again whatever was held.
func (p *proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// Throttle limits each direction of each connection to bytesPerSecond; 0 lifts the limit.
func (p *proxy) Throttle(bytesPerSecond int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rate = bytesPerSecond
}

// Reset closes every current connection with RST.
func (p *proxy) Reset() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close(true)
	}
}

// Down stops listening and resets every connection: to its clients the target looks stopped
// (connection refused).
func (p *proxy) Down() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.mu.Unlock()
	p.Reset()
}

// Up listens again on the same address after Down.
func (p *proxy) Up(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil || p.closed {
		return
	}
	var ln net.Listener
	var err error
	for range 50 { // the port may linger briefly after Close
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("proxy up: %v", err)
	}
	p.serve(ln)
}

// Heal undoes every fault: listening, forwarding, no throttle.
func (p *proxy) Heal(t testing.TB) {
	p.Up(t)
	p.Resume()
	p.Throttle(0)
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.mu.Unlock()
	p.Resume()
	p.Reset()
}

// TestProxyStallsWithoutClosingAndResumes pins the proxy's own behaviour, since the fault tests
// depend on it: a stalled connection stays open and silent, and everything held arrives on Resume.
func TestProxyStallsWithoutClosingAndResumes(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	p := newProxy(t, "127.0.0.1:0", echo.Addr().String())
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip := func(msg string, timeout time.Duration) (string, error) {
		c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write([]byte(msg)); err != nil {
			return "", err
		}
		buf := make([]byte, len(msg))
		_, err := io.ReadFull(c, buf)
		return string(buf), err
	}
	if got, err := roundTrip("ping", 5*time.Second); err != nil || got != "ping" {
		t.Fatalf("before stall: %q, %v", got, err)
	}
	p.Stall()
	var ne net.Error
	if _, err := roundTrip("held", 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("stalled round trip ended with %v, want a timeout (no data, no close)", err)
	}
	p.Resume()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after resume: %q, %v", buf, err)
	}
	p.Reset()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf); err == nil {
		t.Fatal("read after Reset succeeded, want the connection gone")
	}
	p.Down()
	if c2, err := net.DialTimeout("tcp", p.addr, time.Second); err == nil {
		c2.Close()
		t.Fatal("dial while down succeeded")
	}
	p.Up(t)
	c3, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatalf("dial after Up: %v", err)
	}
	c3.Close()
}
