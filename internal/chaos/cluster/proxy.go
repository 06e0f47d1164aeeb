package cluster

import (
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// dialTimeout bounds a proxy's connection to its target: a stopped server refuses at once, and a
// paused one (SIGSTOP) still completes the handshake in the kernel, so only a lost host would
// reach it.
const dialTimeout = 5 * time.Second

// chunkSize is the most a proxy reads at once; queueChunks the chunks it holds per direction of a
// connection (delayed or cut off) before it stops reading, as a full TCP window does.
const (
	chunkSize   = 32 << 10
	queueChunks = 64
)

// proxy forwards TCP connections from its own address to a fixed target, and can be cut like a
// silent network partition: while cut it forwards nothing in either direction and closes
// nothing, and connections made meanwhile are accepted and then left hanging. Heal closes every
// connection it held (with a reset, as a peer gets once the partition ends and its packets reach
// a host that forgot the connection) and forwards new ones again; HealOpen ends the partition
// before either side gave up: the same connections go on, with what they held.
//
// Besides a cut it can drop the replies alone (CutReplies: the target gets and applies every
// request, the client hears nothing) and slow every byte (Shape: latency, jitter, a bandwidth
// cap).
type proxy struct {
	ln     net.Listener
	target string // set before serve
	wg     sync.WaitGroup
	rate   [2]limiter // per direction: toServer, toClient

	mu      sync.Mutex
	cut     bool
	replies bool          // replies dropped (CutReplies)
	shaping Shaping       // Shape
	changed chan struct{} // closed and replaced at every change of the above
	closed  bool
	links   map[*link]struct{}
}

// Shaping slows a proxy's bytes the way a distant or congested network does. The zero value
// forwards at once.
type Shaping struct {
	// Latency delays every chunk of bytes, each way (a round trip gains twice as much).
	Latency time.Duration
	// Jitter adds up to this much more per chunk, drawn afresh for each; a chunk never overtakes
	// the one before it, as TCP keeps order.
	Jitter time.Duration
	// Rate caps the bytes per second each way, shared by all of the proxy's connections; 0: none.
	Rate int64
}

// The two directions of a link.
const (
	toServer = 0
	toClient = 1
)

// link is one client connection and, once dialled, its connection to the target.
type link struct {
	client net.Conn
	done   chan struct{} // closed by close

	mu     sync.Mutex
	server net.Conn
	closed bool
}

// close closes both connections; with reset, so that the peers see a reset rather than an
// orderly end.
func (l *link) close(reset bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	for _, c := range []net.Conn{l.client, l.server} {
		if c == nil {
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok && reset {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
	close(l.done)
}

// setServer records the connection to the target; false when the link was closed meanwhile
// (the caller then closes server).
func (l *link) setServer(server net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.server = server
	return true
}

// listen opens the proxy's listener on a free port of 127.0.0.1; serve starts forwarding. The
// address is known before the target is: a broker advertises its proxies' addresses.
func listen() (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return &proxy{ln: ln, links: make(map[*link]struct{}), changed: make(chan struct{})}, nil
}

// Addr returns the address clients connect to.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// serve forwards every connection to target until close.
func (p *proxy) serve(target string) {
	p.target = target
	p.wg.Go(func() {
		for {
			c, err := p.ln.Accept()
			if err != nil {
				return // closed
			}
			l := &link{client: c, done: make(chan struct{})}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				_ = c.Close()
				return
			}
			p.links[l] = struct{}{}
			p.wg.Go(func() { p.handle(l) })
			p.mu.Unlock()
		}
	})
}

func (p *proxy) handle(l *link) {
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	if !p.waitUncut(l) {
		return // accepted into a partition and reset by its heal, or closed
	}
	server, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		l.close(false) // the client sees its connection end, as with a server that is down
		return
	}
	if !l.setServer(server) {
		_ = server.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(l, server, l.client, toServer) })
	wg.Go(func() { p.pipe(l, l.client, server, toClient) })
	wg.Wait()
}

// chunk is what one read returned: bytes, or the read's error (the end of that direction).
type chunk struct {
	b    []byte
	err  error
	read time.Time
}

// pipe copies src to dst until either fails: one goroutine reads, so that a delay holds each
// chunk for its own latency rather than stalling every byte behind it, and the caller's writes
// what was read, as the proxy's state says.
func (p *proxy) pipe(l *link, dst, src net.Conn, dir int) {
	q := make(chan chunk, queueChunks)
	var reader sync.WaitGroup
	// Every return below has closed the link, which ends the reader's Read.
	defer reader.Wait()
	reader.Go(func() {
		buf := make([]byte, chunkSize)
		for {
			n, err := src.Read(buf)
			c := chunk{b: append([]byte(nil), buf[:n]...), err: err, read: time.Now()}
			select {
			case q <- c:
			case <-l.done:
				return
			}
			if err != nil {
				return
			}
		}
	})
	var last time.Time // when the previous chunk was due: none overtakes it
	for {
		var c chunk
		select {
		case c = <-q:
		case <-l.done:
			return
		}
		if len(c.b) > 0 && !p.deliver(l, dst, c, dir, &last) {
			return
		}
		if c.err != nil {
			// What came before the end went through; the other side sees the end too, unless
			// the end is held as bytes would be (a cut, replies lost): then it waits for the
			// heal.
			if p.holdEnd(l, dir) {
				l.close(false)
			}
			return
		}
	}
}

// deliver writes c to dst once its latency passed, within the bandwidth cap, after a cut ends;
// replies under CutReplies are dropped. False when the link ended meanwhile.
func (p *proxy) deliver(l *link, dst net.Conn, c chunk, dir int, last *time.Time) bool {
	p.mu.Lock()
	s := p.shaping
	p.mu.Unlock()
	if s.Latency > 0 || s.Jitter > 0 {
		due := c.read.Add(s.Latency)
		if s.Jitter > 0 {
			due = due.Add(rand.N(s.Jitter + 1))
		}
		if due.Before(*last) {
			due = *last
		}
		*last = due
		if !waitUntil(l.done, due) {
			return false
		}
	}
	for b := c.b; len(b) > 0; {
		if !p.waitUncut(l) {
			return false
		}
		p.mu.Lock()
		rate, drop := p.shaping.Rate, dir == toClient && p.replies
		p.mu.Unlock()
		if drop {
			return true // the request was applied; its answer is lost
		}
		n := len(b)
		if rate > 0 {
			// Pieces of a twentieth of a second each, so that the cap is smooth and a cut or a
			// change of it takes effect between them.
			n = min(n, max(int(rate/20), 512))
			if !waitUntil(l.done, p.rate[dir].reserve(n, rate)) {
				return false
			}
		}
		if _, err := dst.Write(b[:n]); err != nil {
			l.close(false)
			return false
		}
		b = b[n:]
	}
	return true
}

// holdEnd waits until the end of a direction may pass as its bytes would: after a cut, and never
// while replies are lost (a heal resets the link instead); false when the link ended meanwhile.
func (p *proxy) holdEnd(l *link, dir int) bool {
	for {
		p.mu.Lock()
		held, changed := p.cut || (dir == toClient && p.replies), p.changed
		p.mu.Unlock()
		if !held {
			return true
		}
		select {
		case <-changed:
		case <-l.done:
			return false
		}
	}
}

// waitUncut waits while the proxy is cut; false when the link ended meanwhile.
func (p *proxy) waitUncut(l *link) bool {
	for {
		p.mu.Lock()
		cut, changed := p.cut, p.changed
		p.mu.Unlock()
		if !cut {
			return true
		}
		select {
		case <-changed:
		case <-l.done:
			return false
		}
	}
}

// waitUntil waits until t; false when done closed first.
func waitUntil(done <-chan struct{}, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-done:
		return false
	}
}

// limiter spaces writes of one direction so that they keep to a rate.
type limiter struct {
	mu   sync.Mutex
	next time.Time // when what was reserved so far has gone through
}

// reserve books n bytes at rate bytes per second and returns when they have gone through.
func (lm *limiter) reserve(n int, rate int64) time.Time {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	now := time.Now()
	if lm.next.Before(now) {
		lm.next = now
	}
	lm.next = lm.next.Add(time.Duration(float64(n) / float64(rate) * float64(time.Second)))
	return lm.next
}

// change applies fn to the proxy's state under its lock and wakes every wait on it.
func (p *proxy) change(fn func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn()
	close(p.changed)
	p.changed = make(chan struct{})
}

// Cut stops forwarding on every connection, open or new; it closes none.
func (p *proxy) Cut() { p.change(func() { p.cut = true }) }

// CutReplies drops what the target sends on every connection, open or new, while what clients
// send still reaches it: a request is applied and its answer lost. It closes none.
func (p *proxy) CutReplies() { p.change(func() { p.replies = true }) }

// Heal ends a cut and CutReplies: every connection open now (frozen, or missing replies a TCP
// peer would have retransmitted) is closed with a reset, and new connections are forwarded
// again. Without either it does nothing.
func (p *proxy) Heal() {
	p.change(func() {
		if !p.cut && !p.replies {
			return
		}
		p.cut, p.replies = false, false
		for l := range p.links {
			l.close(true)
		}
	})
}

// HealOpen ends a cut before either side gave up on its connections: each goes on forwarding
// what it held, and the connections accepted during the cut are dialled now. CutReplies is not
// ended: replies dropped cannot be sent again.
func (p *proxy) HealOpen() { p.change(func() { p.cut = false }) }

// Shape slows every connection, open or new, by s; the zero Shaping ends it.
func (p *proxy) Shape(s Shaping) { p.change(func() { p.shaping = s }) }

// Close stops listening, closes every connection and waits for the proxy's goroutines.
func (p *proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	err := p.ln.Close()
	for l := range p.links {
		l.close(false)
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
