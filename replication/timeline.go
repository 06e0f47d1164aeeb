package replication

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// TimelineSwitch is one line of a server's timeline history: timeline Timeline ended at End, where
// the next timeline of this server's history forked from it (a promotion). WAL below End is the
// same on both; from End on, the abandoned timeline's WAL is not in this server's history.
type TimelineSwitch struct {
	Timeline uint32
	End      pglogrepl.LSN
}

// TimelineHistory asks the server pg_dsn leads to for the history of timeline (TIMELINE_HISTORY,
// on a replication connection of its own) and says who answered (IDENTIFY_SYSTEM), so the caller
// can check it is the server its session streams from. Timeline 1 has no history: nil.
func TimelineHistory(ctx context.Context, cfg *Config, timeline uint32) (Identity, []TimelineSwitch, error) {
	conf, err := cfg.ConnConfig()
	if err != nil {
		return Identity{}, nil, err
	}
	rcfg := &conf.Config
	asReplication(rcfg)
	// A bounded wait: the caller retries, and a server that hangs must not hold a session's start.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgconn.ConnectConfig(cctx, rcfg)
	if err != nil {
		return Identity{}, nil, classifyConnect(err, "replication")
	}
	defer conn.Close(context.WithoutCancel(ctx))
	id, _, err := identifySystem(cctx, conn)
	if err != nil {
		return Identity{}, nil, err
	}
	if timeline <= 1 {
		return id, nil, nil
	}
	hist, err := pglogrepl.TimelineHistory(cctx, conn, int32(timeline))
	if err != nil {
		return id, nil, fmt.Errorf("TIMELINE_HISTORY %d: %w", timeline, err)
	}
	switches, err := ParseTimelineHistory(hist.Content)
	if err != nil {
		return id, nil, fmt.Errorf("TIMELINE_HISTORY %d (%s): %w", timeline, hist.FileName, err)
	}
	return id, switches, nil
}

// ParseTimelineHistory reads a timeline history file: per line a parent timeline, the LSN where it
// ended, and a reason; blank lines and lines starting with # are ignored (PostgreSQL's
// readTimeLineHistory).
func ParseTimelineHistory(content []byte) ([]TimelineSwitch, error) {
	var out []TimelineSwitch
	sc := bufio.NewScanner(strings.NewReader(string(content)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			return nil, fmt.Errorf("history line %q: want a timeline and an LSN", line)
		}
		tli, err := strconv.ParseUint(fields[0], 10, 32)
		if err != nil || tli == 0 {
			return nil, fmt.Errorf("history line %q: bad timeline", line)
		}
		end, err := pglogrepl.ParseLSN(fields[1])
		if err != nil {
			return nil, fmt.Errorf("history line %q: bad LSN: %w", line, err)
		}
		if n := len(out); n > 0 && (uint32(tli) <= out[n-1].Timeline || end < out[n-1].End) {
			return nil, fmt.Errorf("history line %q: timelines or LSNs out of order", line)
		}
		out = append(out, TimelineSwitch{Timeline: uint32(tli), End: end})
	}
	return out, sc.Err()
}
