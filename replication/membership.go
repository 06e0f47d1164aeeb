package replication

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// membership is how a publication includes the outbox table, read by membershipSQL. Preflight and
// the periodic publication check (horizon.go) judge it with the same rules (problem), so a
// publication the relay starts with is never one it stops on half a second later, and the reverse.
type membership struct {
	oid         *uint32 // the outbox table's OID now; nil when no table has its name
	pubOID      *uint32 // the publication's OID; nil when it does not exist
	pubInsert   bool
	viaRoot     bool
	partitioned bool
	// tokens name the catalog rows through which the publication includes the table, sorted:
	// "rel:<pg_publication_rel.oid>" (the table, or, without publish_via_partition_root, an
	// ancestor of it, is listed), "ns:<pg_publication_namespace.oid>" (its schema, or an
	// ancestor's, is published) and "all" (FOR ALL TABLES). A row that is removed and added again
	// comes back with another OID, so two reads that share a token saw the table included
	// without interruption in between.
	tokens []string
	// viaAncestor: publish_via_partition_root and an ancestor of the outbox is published, so its
	// rows arrive under the ancestor's name.
	viaAncestor bool
	// partsOnly: the outbox is partitioned and the publication lists partitions of it, not it.
	partsOnly  bool
	rowFilter  bool // a row filter (WHERE) on the table, an ancestor or a partition of it
	columnList bool // a column list on the table, an ancestor or a partition of it
	// unreplicated is "unlogged <name>" or "foreign <name>" for the table or a partition of it whose
	// rows PostgreSQL writes no WAL for (UNLOGGED) or keeps on another server; empty when none.
	// A publication includes such a partition without a complaint, and logical decoding never
	// sees its rows. Only tables count: a partitioned table holds no rows, whatever its own
	// persistence says.
	unreplicated string
	// pubXmin is the xmin of the publication's pg_publication row: every ALTER PUBLICATION that
	// changes an option (publish, publish_via_partition_root), the owner or the name writes a new
	// row version with a new xmin, which a freeze keeps (PostgreSQL 9.4 on marks a frozen row
	// with flag bits and leaves its xmin). Adding or dropping tables and schemas leaves the row
	// alone. Two reads with the same pubXmin saw no such ALTER in between (see altered).
	pubXmin string
}

// membershipSQL returns the query that reads a membership for table $1 (qualified, quoted) and
// publication $2 on a server of major version major, one row of text columns. Row filters,
// column lists and FOR TABLES IN SCHEMA exist from PostgreSQL 15 on.
func membershipSQL(major int) string {
	filter, cols, schemas := "r.prqual IS NOT NULL", "r.prattrs IS NOT NULL", `
			UNION ALL
			SELECT 'ns:' || n.oid, a.self FROM pub JOIN pg_publication_namespace n ON n.pnpubid = pub.oid
				JOIN pg_class c ON c.relnamespace = n.pnnspid JOIN anc a ON a.relid = c.oid`
	if major < 15 {
		filter, cols, schemas = "false", "false", ""
	}
	// pg_partition_ancestors and pg_partition_tree return nothing for a table that is not part of
	// a partition tree, so the table itself is added to both.
	return `WITH t AS (SELECT to_regclass($1)::oid AS relid),
		pub AS (SELECT p.oid, p.xmin, p.puballtables, p.pubinsert, p.pubviaroot FROM pg_publication p WHERE p.pubname = $2),
		anc AS (SELECT t.relid, true AS self FROM t WHERE t.relid IS NOT NULL
			UNION SELECT a.relid, false FROM t, pg_partition_ancestors(t.relid) a WHERE a.relid <> t.relid),
		tree AS (SELECT t.relid FROM t WHERE t.relid IS NOT NULL UNION SELECT p.relid FROM t, pg_partition_tree(t.relid) p),
		member AS (
			SELECT 'rel:' || r.oid AS token, a.self FROM pub JOIN pg_publication_rel r ON r.prpubid = pub.oid JOIN anc a ON a.relid = r.prrelid` + schemas + `
			UNION ALL
			SELECT 'all', NOT EXISTS (SELECT 1 FROM anc WHERE NOT anc.self) FROM pub WHERE pub.puballtables)
	SELECT t.relid::text, pub.oid::text, coalesce(pub.pubinsert, false)::text, coalesce(pub.pubviaroot, false)::text,
		coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = t.relid), false)::text,
		coalesce((SELECT string_agg(m.token, ',' ORDER BY m.token) FROM member m WHERE m.self OR NOT pub.pubviaroot), ''),
		(coalesce(pub.pubviaroot, false) AND EXISTS (SELECT 1 FROM member m WHERE NOT m.self))::text,
		EXISTS (SELECT 1 FROM pub JOIN pg_publication_rel r ON r.prpubid = pub.oid JOIN tree ON tree.relid = r.prrelid WHERE r.prrelid <> t.relid)::text,
		EXISTS (SELECT 1 FROM pub JOIN pg_publication_rel r ON r.prpubid = pub.oid
			WHERE r.prrelid IN (SELECT relid FROM tree UNION SELECT relid FROM anc) AND ` + filter + `)::text,
		EXISTS (SELECT 1 FROM pub JOIN pg_publication_rel r ON r.prpubid = pub.oid
			WHERE r.prrelid IN (SELECT relid FROM tree UNION SELECT relid FROM anc) AND ` + cols + `)::text,
		(SELECT CASE WHEN c.relkind = 'f' THEN 'foreign ' ELSE 'unlogged ' END || c.oid::regclass::text
			FROM tree JOIN pg_class c ON c.oid = tree.relid
			WHERE (c.relkind = 'r' AND c.relpersistence <> 'p') OR c.relkind = 'f' ORDER BY c.oid LIMIT 1),
		coalesce(pub.xmin::text, '')
	FROM t LEFT JOIN pub ON true`
}

// parseMembership reads membershipSQL's row (NULL as nil).
func parseMembership(row [][]byte) (membership, error) {
	if len(row) != 12 {
		return membership{}, fmt.Errorf("publication membership: %d columns, want 12", len(row))
	}
	var m membership
	var err error
	if m.oid, err = parseOID(row[0]); err != nil {
		return m, err
	}
	if m.pubOID, err = parseOID(row[1]); err != nil {
		return m, err
	}
	flag := func(b []byte) bool { return string(b) == "true" }
	m.pubInsert, m.viaRoot, m.partitioned = flag(row[2]), flag(row[3]), flag(row[4])
	if len(row[5]) > 0 {
		m.tokens = strings.Split(string(row[5]), ",")
	}
	m.viaAncestor, m.partsOnly, m.rowFilter, m.columnList = flag(row[6]), flag(row[7]), flag(row[8]), flag(row[9])
	m.unreplicated = string(row[10])
	m.pubXmin = string(row[11])
	return m, nil
}

func parseOID(b []byte) (*uint32, error) {
	if b == nil {
		return nil, nil
	}
	v, err := strconv.ParseUint(string(b), 10, 32)
	if err != nil {
		return nil, fmt.Errorf("publication membership: OID %q: %w", b, err)
	}
	o := uint32(v)
	return &o, nil
}

// serverMajor is the major version of the server conn is connected to (0 when unknown).
func serverMajor(version string) int {
	major, _, _ := strings.Cut(version, ".")
	major, _, _ = strings.Cut(major, " ")
	n, _ := strconv.Atoi(major)
	return n
}

// problem says what keeps the publication from streaming every outbox row under the outbox's
// name, with the fix, or nil. The table's existence and identity are the caller's to judge.
func (m membership) problem(table, publication string) error {
	pub := pgx.Identifier{publication}.Sanitize()
	switch {
	case m.pubOID == nil:
		return fatalf("publication %q does not exist: run `outbox-relay migrate`, or CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)",
			publication, pub, table)
	case !m.pubInsert:
		return fatalf("publication %q does not publish INSERTs, so outbox rows would be skipped: run ALTER PUBLICATION %s SET (publish = 'insert')", publication, pub)
	case m.rowFilter:
		return fatalf("publication %q has a row filter (WHERE) on %s or a partition or ancestor of it, so PostgreSQL leaves the rows it filters out of the replication stream and they would never be published: run ALTER PUBLICATION %s SET TABLE %s (without WHERE), or use a publication without a row filter",
			publication, table, pub, table)
	case m.columnList:
		return fatalf("publication %q has a column list on %s or a partition or ancestor of it, so PostgreSQL streams only those columns: run ALTER PUBLICATION %s SET TABLE %s (without a column list), or use a publication without one",
			publication, table, pub, table)
	case m.unreplicated != "":
		kind, name, _ := strings.Cut(m.unreplicated, " ")
		if kind == "foreign" {
			return fatalf("%s, a partition of %s, is a foreign table: its rows live on another server and never reach this server's WAL, so they would never be published: detach it (ALTER TABLE %s DETACH PARTITION %s) and write outbox rows to local partitions only",
				name, table, table, name)
		}
		return fatalf("%s is UNLOGGED (the outbox table or a partition of it): PostgreSQL writes no WAL for its rows, so logical decoding never sees them and they would never be published: run ALTER TABLE %s SET LOGGED",
			name, name)
	case m.viaAncestor:
		return fatalf("publication %q publishes a partitioned table that %s is a partition of, with publish_via_partition_root, so the outbox rows arrive under that table's name: publish %s in a publication of its own (CREATE PUBLICATION ... FOR TABLE %s WITH (publish = 'insert'))",
			publication, table, table, table)
	case len(m.tokens) == 0 && m.partsOnly:
		return fatalf("publication %q lists partitions of %s but not the partitioned table itself, so partitions added later are not published: run ALTER PUBLICATION %s ADD TABLE %s (and SET (publish_via_partition_root = true))",
			publication, table, pub, table)
	case len(m.tokens) == 0:
		return fatalf("publication %q does not include %s: run ALTER PUBLICATION %s ADD TABLE %s",
			publication, table, pub, table)
	}
	return nil
}

// continuous reports whether the publication included the table without interruption between
// the read prev and the read m: the same publication, and a membership row present in both.
func (m membership) continuous(prev membership) bool {
	if prev.pubOID == nil || m.pubOID == nil || *prev.pubOID != *m.pubOID {
		return false
	}
	for _, t := range m.tokens {
		for _, p := range prev.tokens {
			if t == p {
				return true
			}
		}
	}
	return false
}

// altered reports whether the publication's own row changed between the read prev and the read m
// (an ALTER PUBLICATION ... SET, OWNER TO or RENAME committed in between). The row as it is now
// says nothing of the versions in between: publish may have left out INSERTs for a while and been
// restored, and pgoutput decodes each row with the publication as it was when the row was written,
// so rows inserted meanwhile are not in the stream, not even when the slot is streamed again.
// Whether they were cannot be told, so any such change counts.
func (m membership) altered(prev membership) bool {
	return prev.pubXmin != "" && m.pubXmin != prev.pubXmin
}
