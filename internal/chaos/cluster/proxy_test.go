package cluster

import (
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
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer echo.Close()
	wg.Go(func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
	p, err := listen()
	if err != nil {
		t.Fatal(err)
	}
	p.serve(echo.Addr().String())
	defer p.Close()

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
