package replication_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/metrics"
	"github.com/outbox-relay/outbox-relay/replication"
)

// splitProxy stands for a pg_dsn whose connections do not all reach the same server (a multi-host
// pg_dsn, a host name that moved between two connections): it forwards replication connections
// to one address and all others to another. Only this routing is fake; both ends are real servers.
func splitProxy(t *testing.T, ordinary, replication string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer client.Close()
				startup, err := readStartup(client)
				if err != nil {
					return
				}
				target := ordinary
				if bytes.Contains(startup, []byte("replication\x00database\x00")) {
					target = replication
				}
				server, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer server.Close()
				if _, err := server.Write(startup); err != nil {
					return
				}
				go func() { io.Copy(server, client); server.Close() }()
				io.Copy(client, server)
			}()
		}
	}()
	return ln.Addr().String()
}

// readStartup reads the client's StartupMessage, declining SSL and GSS encryption on the way.
func readStartup(c net.Conn) ([]byte, error) {
	for {
		var head [4]byte
		if _, err := io.ReadFull(c, head[:]); err != nil {
			return nil, err
		}
		n := binary.BigEndian.Uint32(head[:])
		if n < 8 || n > 10000 {
			return nil, errors.New("not a startup message")
		}
		msg := make([]byte, n)
		copy(msg, head[:])
		if _, err := io.ReadFull(c, msg[4:]); err != nil {
			return nil, err
		}
		switch binary.BigEndian.Uint32(msg[4:8]) {
		case 80877103, 80877104: // SSLRequest, GSSENCRequest
			if _, err := c.Write([]byte{'N'}); err != nil {
				return nil, err
			}
		default:
			return msg, nil
		}
	}
}

// When pg_dsn's ordinary connection (the checks) and its replication connection reach two
// different database clusters, the checks' findings (the slot, the outbox table's OID) are not
// about the server streamed from: the stream must refuse before it creates or streams a slot.
func TestChecksAndStreamOnTwoClustersAreRefused(t *testing.T) {
	ctx := context.Background()
	first, second := testenv.Postgres(t), testenv.Postgres(t)
	dsn := testenv.OutboxDatabase(t, first)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	database := strings.TrimPrefix(u.Path, "/")
	secondDSN, err := second.CreateDatabase(ctx, database)
	if err != nil {
		t.Fatal(err)
	}
	secondURL, _ := url.Parse(secondDSN)
	u.Host = splitProxy(t, "127.0.0.1:"+strings.Split(u.Host, ":")[1], secondURL.Host)

	slot := testenv.UniqueName(t, "slot")
	s := replication.New(replication.Config{
		DSN: u.String(), Slot: slot, Publication: slot, Table: "outbox_events",
		CreateSlot: true, CreatePublication: true,
	}, checkpoint.New(0), zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out := make(chan replication.Message, s.Buffer())
	go func() {
		for range out {
		}
	}()
	err = s.Run(runCtx, out)
	if !replication.IsFatal(err) || !strings.Contains(err.Error(), "two database clusters") {
		t.Fatalf("Run = %v, want a fatal error saying pg_dsn reached two database clusters", err)
	}
	conn, err := pgx.Connect(ctx, secondDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var slots int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots").Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 0 {
		t.Fatalf("%d slots on the replication connection's cluster, want none created there", slots)
	}
}

// A primary_dsn leading to another database cluster than pg_dsn's (decoding on a standby) would
// take the heartbeats and the slot ledger's writes where they never reach the slot: the stream
// refuses it in one line naming primary_dsn, before it creates a slot.
func TestPrimaryDSNOnAnotherClusterIsRefused(t *testing.T) {
	ctx := context.Background()
	version, err := testenv.PGVersion()
	if err != nil {
		t.Fatal(err)
	}
	other := "14"
	if version == other {
		other = "16"
	}
	dsn := testenv.OutboxDatabase(t, testenv.SharedPostgres(t))
	slot := testenv.UniqueName(t, "slot")
	s := replication.New(replication.Config{
		DSN: dsn, PrimaryDSN: testenv.OutboxDatabase(t, testenv.SharedPostgresVersion(t, other)),
		Slot: slot, Publication: slot, Table: "outbox_events", CreateSlot: true, CreatePublication: true,
	}, checkpoint.New(0), zaptest.NewLogger(t), metrics.New(prometheus.NewRegistry()))
	runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out := make(chan replication.Message, s.Buffer())
	go func() {
		for range out {
		}
	}()
	err = s.Run(runCtx, out)
	if !replication.IsFatal(err) || !strings.Contains(err.Error(), "primary_dsn leads to another database cluster") {
		t.Fatalf("Run = %v, want a fatal error saying primary_dsn leads to another database cluster", err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var slots int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 0 {
		t.Fatal("the stream created its slot before refusing primary_dsn")
	}
}
