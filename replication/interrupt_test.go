package replication

import (
	"context"
	"net"
	"testing"
	"time"
)

// TestAnInterruptDoesNotOutliveItsRelease: when ctx ends just as the reader stops watching it, the
// callback that expires the deadline may already be under way. Release must wait for it, or it
// lands after the caller set its own deadline (endCopy's), which then fails at once and the final
// status update is lost.
func TestAnInterruptDoesNotOutliveItsRelease(t *testing.T) {
	for i := range 2000 {
		a, b := net.Pipe()
		ctx, cancel := context.WithCancel(context.Background())
		release := interruptOnDone(ctx, a)
		cancel() // ctx ends: the callback starts on its own goroutine
		release()
		a.SetDeadline(time.Now().Add(time.Minute)) // the caller's own deadline, as endCopy sets it
		go b.Write([]byte{1})
		if _, err := a.Read(make([]byte, 1)); err != nil {
			t.Fatalf("iteration %d: a read after release failed: %v (the interrupt landed after the caller's deadline)", i, err)
		}
		a.Close()
		b.Close()
	}
}
