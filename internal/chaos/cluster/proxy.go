package cluster

import (
	"net"
	"sync"
	"time"
)

// dialTimeout bounds a proxy's connection to its target: a stopped server refuses at once, and a
// paused one (SIGSTOP) still completes the handshake in the kernel, so only a lost host would
// reach it.
const dialTimeout = 5 * time.Second

// proxy forwards TCP connections from its own address to a fixed target, and can be cut like a
// silent network partition: while cut it forwards nothing in either direction and closes
// nothing, and connections made meanwhile are accepted and then left hanging. Healing closes every
// connection it held (with a reset, as a peer gets once the partition ends and its packets reach
// a host that forgot the connection) and forwards new ones again.
type proxy struct {
	ln     net.Listener
	target string // set before serve
	wg     sync.WaitGroup

	mu     sync.Mutex
	cut    bool
	closed bool
	links  map[*link]struct{}
}

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
	return &proxy{ln: ln, links: make(map[*link]struct{})}, nil
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
	if p.isCut() {
		<-l.done // accepted into a partition: hangs until healed or closed
		return
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
	wg.Go(func() { p.pipe(l, server, l.client) })
	wg.Go(func() { p.pipe(l, l.client, server) })
	wg.Wait()
}

// pipe copies src to dst until either fails. Whatever it reads while the proxy is cut it holds,
// and waits for the link's end, keeping both connections open.
func (p *proxy) pipe(l *link, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if p.isCut() {
			<-l.done
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				l.close(false)
				return
			}
		}
		if err != nil {
			l.close(false)
			return
		}
	}
}

func (p *proxy) isCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

// Cut stops forwarding on every connection, open or new; it closes none.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
}

// Heal ends a cut: every connection open now (all were frozen) is closed with a reset, and new
// connections are forwarded again. Without a cut it does nothing.
func (p *proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		return
	}
	p.cut = false
	for l := range p.links {
		l.close(true)
	}
}

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
