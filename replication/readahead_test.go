package replication

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// TestForwardBoundsTheBytesReadAheadOfTheConsumer: Data messages handed to the consumer and not
// released count against BufferBytes, whatever the channel's capacity; a message larger than the
// budget goes through alone; the data is copied (pgconn reuses its buffer).
func TestForwardBoundsTheBytesReadAheadOfTheConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// No status update falls due during the test, so forward never touches the (absent) connection.
	s := &wire{ahead: newReadAhead(100), nextStatus: time.Now().Add(time.Hour)}
	out := make(chan Message, 32)
	data := func(n int) Message { return Message{Kind: Data, Data: bytes.Repeat([]byte{'x'}, n)} }

	buf := data(60)
	if err := s.forward(ctx, out, buf); err != nil {
		t.Fatal(err)
	}
	buf.Data[0] = 'y' // pgconn reusing its read buffer
	first := <-out
	if first.Data[0] != 'x' {
		t.Fatal("forward handed on pgconn's buffer instead of a copy")
	}
	// Keepalives carry no data and never wait for the budget.
	if err := s.forward(ctx, out, Message{Kind: Keepalive}); err != nil {
		t.Fatal(err)
	}
	<-out

	// 60 + 60 > 100: the second waits until the consumer releases the first, though the channel has room.
	done := make(chan error, 1)
	go func() { done <- s.forward(ctx, out, data(60)) }()
	select {
	case err := <-done:
		t.Fatalf("a message past the byte budget was forwarded before the consumer released anything (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	first.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	second := <-out
	second.Release()

	// Larger than the whole budget: admitted alone, then it holds back the next one.
	if err := s.forward(ctx, out, data(500)); err != nil {
		t.Fatal(err)
	}
	huge := <-out
	waitCtx, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stop()
	if err := s.forward(waitCtx, out, data(1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a message was admitted next to one larger than the budget (err %v)", err)
	}
	huge.Release()
	if err := s.forward(ctx, out, data(1)); err != nil {
		t.Fatal(err)
	}
	(<-out).Release()
	if s.ahead.used != 0 {
		t.Fatalf("%d bytes still counted after every message was released", s.ahead.used)
	}
}
