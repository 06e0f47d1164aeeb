package replication

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// The walsender's shutdown (WalSndDone) asks for a reply with every keepalive, as soon as it has
// read the previous reply, at the same WAL end: that is recognised within a few round trips. A
// walsender at work asks only after half its wal_sender_timeout of silence, and sends data or
// keepalives without a request in between: never taken for a shutdown.
func TestTheWalsendersShutdownPatternIsRecognisedAndNothingElse(t *testing.T) {
	const interval = time.Second
	type ka struct {
		reply bool
		end   pglogrepl.LSN
		after time.Duration // since the previous one
		data  bool          // XLogData arrives before it
	}
	pings := func(n int, gap time.Duration) []ka {
		var k []ka
		for range n {
			k = append(k, ka{reply: true, end: 100, after: gap})
		}
		return k
	}
	tests := []struct {
		name string
		kas  []ka
		want int // the keepalive (1-based) that is recognised; 0: none
	}{
		{"requests back to back at one WAL end", pings(shutdownPings, time.Millisecond), shutdownPings},
		{"one request per half wal_sender_timeout", pings(20, 30*time.Second), 0},
		{"requests spread over more than a status interval", pings(20, interval/3), 0},
		{"keepalives without a request", []ka{{end: 100}, {end: 100}, {end: 100}, {end: 100}, {end: 100}, {end: 100}, {end: 100}}, 0},
		{"data between the requests", func() []ka {
			k := pings(10, time.Millisecond)
			for i := range k {
				k[i].data = i%3 == 0
			}
			return k
		}(), 0},
		{"a moving WAL end", func() []ka {
			k := pings(10, time.Millisecond)
			for i := range k {
				k[i].end += pglogrepl.LSN(i)
			}
			return k
		}(), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s stopSigns
			now := time.Now()
			got := 0
			for i, k := range tt.kas {
				now = now.Add(k.after)
				if k.data {
					s.data()
				}
				if s.keepalive(k.reply, k.end, now, interval) && got == 0 {
					got = i + 1
				}
			}
			if got != tt.want {
				t.Fatalf("recognised at keepalive %d, want %d (0: never)", got, tt.want)
			}
		})
	}
}
