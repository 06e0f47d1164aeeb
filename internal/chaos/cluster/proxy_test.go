package cluster

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A cut proxy forwards nothing and closes nothing, new connections hang, and the heal resets what
// it held and forwards new connections again.
func TestProxyCutHoldsEverythingAndHealResetsIt(t *testing.T) {
	p := echoProxy(t)

	held := dial(t, p.Addr())
	defer held.Close()
	if err := echoes(held, "before"); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	p.Cut()
	if err := echoes(held, "during"); !isTimeout(err) {
		t.Fatalf("an open connection during the cut: %v, want a timeout", err)
	}
	fresh := dial(t, p.Addr()) // the kernel accepts it; nothing answers
	defer fresh.Close()
	if err := echoes(fresh, "during"); !isTimeout(err) {
		t.Fatalf("a new connection during the cut: %v, want a timeout", err)
	}
	p.Heal()
	for name, c := range map[string]net.Conn{"open": held, "new": fresh} {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("the %s connection after the heal: %v, want a reset", name, err)
		}
	}
	after := dial(t, p.Addr())
	defer after.Close()
	if err := echoes(after, "after"); err != nil {
		t.Fatalf("after the heal: %v", err)
	}
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// echoes writes s and reads it back within 300ms.
func echoes(c net.Conn, s string) error {
	_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(s)); err != nil {
		return err
	}
	buf := make([]byte, len(s))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != s {
		return errors.New("echoed " + string(buf))
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// echoProxy starts an echo server and a proxy in front of it, both closed at the test's end.
func echoProxy(t *testing.T) *proxy {
	p, _ := recordingProxy(t)
	return p
}

// recordingProxy is echoProxy whose server also sends each piece of what it reads to got, and
// connEnded when a connection's read ends.
func recordingProxy(t *testing.T) (*proxy, <-chan string) {
	t.Helper()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 64)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { _ = echo.Close() })
	wg.Go(func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						select {
						case got <- string(buf[:n]):
						default: // a test reading bulk does not look
						}
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						select {
						case got <- connEnded:
						default:
						}
						return
					}
				}
			})
		}
	})
	p, err := listen()
	if err != nil {
		t.Fatal(err)
	}
	p.serve(echo.Addr().String())
	t.Cleanup(func() { _ = p.Close() })
	return p, got
}

// connEnded is what recordingProxy's server reports when a connection's read ends.
const connEnded = "<end>"

// timedEcho writes s on c and reads it back within limit, returning how long it took.
func timedEcho(c net.Conn, s string, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	_ = c.SetDeadline(start.Add(limit))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(s)); err != nil {
		return 0, err
	}
	buf := make([]byte, len(s))
	if _, err := io.ReadFull(c, buf); err != nil {
		return 0, err
	}
	if !bytes.Equal(buf, []byte(s)) {
		return 0, errors.New("echoed something else")
	}
	return time.Since(start), nil
}

// Latency and jitter delay every chunk each way on a connection open before the shaping, the
// bandwidth cap spaces bulk bytes to the rate, and the zero shaping forwards at once again.
func TestProxyShapeDelaysAndCapsOpenConnections(t *testing.T) {
	bulk := string(bytes.Repeat([]byte("x"), 50_000))
	for _, tc := range []struct {
		name     string
		shaping  Shaping
		payload  string
		min, max time.Duration
	}{
		// Each way: 150 ms and up to 50 ms of jitter, so a round trip takes 300 to 400 ms.
		{"a small round trip takes twice the latency and at most twice the jitter more", Shaping{Latency: 150 * time.Millisecond, Jitter: 50 * time.Millisecond}, "ping", 300 * time.Millisecond, 2 * time.Second},
		// 50 kB at 100 kB a second takes half a second each way; the two ways overlap.
		{"50 kB at 100 kB a second take at least half a second", Shaping{Rate: 100_000}, bulk, 500 * time.Millisecond, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := echoProxy(t)
			c := dial(t, p.Addr())
			defer c.Close()
			if took, err := timedEcho(c, tc.payload, 5*time.Second); err != nil || took >= tc.min {
				t.Fatalf("before the shaping: %v in %v, want under %v", err, took, tc.min)
			}
			p.Shape(tc.shaping)
			took, err := timedEcho(c, tc.payload, 10*time.Second)
			if err != nil {
				t.Fatalf("shaped: %v", err)
			}
			if took < tc.min || took > tc.max {
				t.Fatalf("shaped: the round trip took %v, want %v to %v", took, tc.min, tc.max)
			}
			p.Shape(Shaping{})
			if took, err := timedEcho(c, tc.payload, 5*time.Second); err != nil || took >= tc.min {
				t.Fatalf("after the shaping: %v in %v, want under %v", err, took, tc.min)
			}
		})
	}
}

// With the replies cut, what the client sends reaches the server on open and new connections
// while nothing comes back; the heal resets them and new connections round-trip again.
func TestProxyCutRepliesDeliversRequestsAndDropsAnswers(t *testing.T) {
	p, got := recordingProxy(t)
	held := dial(t, p.Addr())
	defer held.Close()
	if err := echoes(held, "before"); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	<-got
	p.CutReplies()
	fresh := dial(t, p.Addr())
	defer fresh.Close()
	for name, c := range map[string]net.Conn{"open": held, "new": fresh} {
		if err := echoes(c, "applied"); !isTimeout(err) {
			t.Fatalf("the %s connection during the cut: %v, want a timeout", name, err)
		}
		select {
		case s := <-got:
			if s != "applied" {
				t.Fatalf("the server read %q on the %s connection, want %q", s, name, "applied")
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the server never read the request sent on the %s connection", name)
		}
	}
	p.Heal()
	for name, c := range map[string]net.Conn{"open": held, "new": fresh} {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("the %s connection after the heal: %v, want a reset", name, err)
		}
	}
	after := dial(t, p.Addr())
	defer after.Close()
	if err := echoes(after, "after"); err != nil {
		t.Fatalf("after the heal: %v", err)
	}
}

// HealOpen ends a cut without closing anything: what was sent during it arrives, the open
// connection and one accepted during the cut go on forwarding, and a connection closed during the
// cut ends at the server only then.
func TestProxyHealOpenKeepsTheConnections(t *testing.T) {
	p, got := recordingProxy(t)
	held, closer := dial(t, p.Addr()), dial(t, p.Addr())
	defer held.Close()
	for _, c := range []net.Conn{held, closer} {
		if err := echoes(c, "before"); err != nil {
			t.Fatalf("before the cut: %v", err)
		}
		<-got
	}
	p.Cut()
	fresh := dial(t, p.Addr())
	defer fresh.Close()
	for _, c := range []net.Conn{held, fresh} {
		if _, err := c.Write([]byte("held")); err != nil {
			t.Fatal(err)
		}
	}
	_ = closer.Close()
	select {
	case s := <-got:
		t.Fatalf("the server read %q during the cut", s)
	case <-time.After(300 * time.Millisecond):
	}
	p.HealOpen()
	for name, c := range map[string]net.Conn{"open": held, "new": fresh} {
		buf := make([]byte, len("held"))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
			t.Fatalf("the %s connection after the heal read %q, %v: want what it sent during the cut", name, buf, err)
		}
		if err := echoes(c, "after"); err != nil {
			t.Fatalf("the %s connection after the heal: %v", name, err)
		}
	}
	for timeout := time.After(5 * time.Second); ; {
		select {
		case s := <-got:
			if s == connEnded {
				return
			}
		case <-timeout:
			t.Fatal("the connection closed during the cut never ended at the server after the heal")
		}
	}
}
