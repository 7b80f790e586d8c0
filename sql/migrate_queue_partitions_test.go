package schema_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
)

// TestMigration0215MovesEveryMessageToItsPartition: migration 0215 makes
// streamd.queue_messages a table LIST-partitioned by queue and moves every message
// into its queue's partition without losing or changing one. On a database at the
// schema before it, holding messages ready, in flight (with its token), delayed in
// the lane (with its due_at), nacked with a delay, dead-lettered (with provenance),
// in a FIFO group, of a tenant with a dedup id, binary, and one of a queue name with
// no queue row, every row reads the same afterwards, each from its queue's partition
// (its own primary key on "offset", fillfactor 50, row-level security on); the view
// reads the same; the lease in flight acks with its token, a receive delivers what
// was visible (the due lane message too), the dead letter redrives, the FIFO group
// delivers its head, and a new queue gets a partition of its own.
func TestMigration0215MovesEveryMessageToItsPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connectBefore(t, 215)

	_, err := conn.Exec(ctx, `
		CREATE SEQUENCE streamd.seq_q AS bigint MINVALUE 1 START 1 INCREMENT BY 128;
		CREATE SEQUENCE streamd.seq_dlq AS bigint MINVALUE 1 START 1 INCREMENT BY 128;
		CREATE SEQUENCE streamd.seq_f AS bigint MINVALUE 1 START 1 INCREMENT BY 128;
		SELECT setval('streamd.seq_q', 129), setval('streamd.seq_dlq', 129), setval('streamd.seq_f', 129);
		INSERT INTO streamd.queues (queue_name, fifo, max_delivery_attempts, offset_seq) VALUES
			('dlq', false, 5, 'streamd.seq_dlq'), ('f', true, 5, 'streamd.seq_f');
		INSERT INTO streamd.queues (queue_name, max_delivery_attempts, dead_letter_queue, offset_seq)
			VALUES ('q', 3, 'dlq', 'streamd.seq_q');
		INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, data_bytes, metadata, enqueued_at,
		                                    visibility_timeout, delivery_attempts, lease_token, dedup, tenant_id, group_key,
		                                    max_delivery_attempts, last_error, origin_stream, origin_offset, origin_attempts,
		                                    dead_lettered_at, due_at) VALUES
			-- ready
			('q', 1, 'm1', '{"n":1}', NULL, NULL, now() - interval '2 min', now() - interval '1 min', 0, NULL, false, NULL, NULL,
			 NULL, NULL, NULL, NULL, NULL, NULL, NULL),
			-- in flight
			('q', 2, 'm2', '{"n":2}', NULL, NULL, now() - interval '2 min', now() + interval '10 min', 1,
			 '00000000-0000-0000-0000-000000000002', false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
			-- nacked with a delay
			('q', 3, 'm3', '{"n":3}', NULL, NULL, now() - interval '2 min', now() + interval '5 min', 2, NULL, false, NULL, NULL,
			 NULL, 'boom', NULL, NULL, NULL, NULL, NULL),
			-- a tenant's, with headers, its own attempts and a dedup id
			('q', 4, 'order-1', '{"n":4}', NULL, '{"k":"v"}', now() - interval '2 min', now() - interval '1 min', 0, NULL, true,
			 'acme', NULL, 9, NULL, NULL, NULL, NULL, NULL, NULL),
			-- binary
			('q', 5, 'm5', NULL, '\x0001', NULL, now() - interval '2 min', now() - interval '1 min', 0, NULL, false, NULL, NULL,
			 NULL, NULL, NULL, NULL, NULL, NULL, NULL),
			-- delayed in the lane: one due, one not
			('q', 4503599627370496 + 6, 'due', '{"n":6}', NULL, NULL, now() - interval '2 min', now() - interval '1 min', 0,
			 NULL, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, now() - interval '1 min'),
			('q', 4503599627370496 + 7, 'later', '{"n":7}', NULL, NULL, now(), now() + interval '1 hour', 0,
			 NULL, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, now() + interval '1 hour'),
			-- a dead letter with its provenance
			('dlq', 1, 'm0', '{"n":0}', NULL, NULL, now() - interval '3 min', now() - interval '1 min', 0, NULL, false, NULL,
			 NULL, NULL, 'gave up', 'q', 0, 3, now() - interval '1 min', NULL),
			-- FIFO
			('f', 1, 'f1', '{"n":1}', NULL, NULL, now() - interval '2 min', now() - interval '1 min', 0, NULL, false, 'acme',
			 'g', NULL, NULL, NULL, NULL, NULL, NULL, NULL),
			('f', 2, 'f2', '{"n":2}', NULL, NULL, now() - interval '2 min', now() - interval '1 min', 0, NULL, false, 'acme',
			 'g', NULL, NULL, NULL, NULL, NULL, NULL, NULL),
			-- of a queue name with no queue row (kept, not lost)
			('gone', 1, 'x1', '{}', NULL, NULL, now(), now(), 0, NULL, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
		INSERT INTO streamd.message_groups (stream_name, group_key, tenant_id, visible_at)
			VALUES ('f', 'g', 'acme', now() - interval '1 min');`)
	require.NoError(t, err)

	read := func(query string) []string {
		t.Helper()
		rows, err := conn.Query(ctx, query)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	const rowsQuery = `SELECT m::text FROM (SELECT * FROM streamd.queue_messages ORDER BY stream_name, "offset") m`
	const viewQuery = `SELECT m::text FROM (SELECT * FROM streamd.messages ORDER BY stream_name, "offset") m`
	before, beforeView := read(rowsQuery), read(viewQuery)
	require.Len(t, before, 11)

	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)

	require.Equal(t, before, read(rowsQuery), "every message, as it was")
	require.Equal(t, beforeView, read(viewQuery), "every message, as it was, through seed 003's view")
	var kind string
	require.NoError(t, conn.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'streamd.queue_messages'::regclass`).Scan(&kind))
	require.Equal(t, "p", kind)
	// Each message is in its queue's partition, and each partition is what the
	// parent's storage was: its own key, fillfactor 50, row-level security.
	require.Equal(t, []string{"dlq 1", "f 2", "gone 1", "q 7"}, read(`
		SELECT format('%s %s', min(m.stream_name), count(*)) FROM streamd.queue_messages m
		WHERE m.tableoid = format('streamd.%I', 'queue_messages_' || md5(m.stream_name))::regclass
		GROUP BY m.tableoid ORDER BY 1`))
	require.Equal(t, []string{`"offset" fillfactor=50 t`}, read(`
		SELECT DISTINCT format('%s %s %s', pg_get_indexdef(i.indexrelid, 1, true),
		                      (SELECT o FROM unnest(c.reloptions) o WHERE o LIKE 'fillfactor%'), c.relrowsecurity)
		FROM pg_inherits p JOIN pg_class c ON c.oid = p.inhrelid
		JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
		WHERE p.inhparent = 'streamd.queue_messages'::regclass AND c.relname <> 'queue_messages_no_queue'`))

	// The lease in flight still settles with its token.
	var acked int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_ack('q', ARRAY[2::bigint],
		ARRAY['00000000-0000-0000-0000-000000000002'::uuid], NULL)`).Scan(&acked))
	require.Equal(t, 1, acked)
	// What was visible is delivered, the due lane message with it; nacked and delayed
	// ones are not.
	require.ElementsMatch(t, []string{"due", "m1", "order-1", "m5"},
		read(`SELECT message_id FROM streamd.queue_receive('q', 10, NULL, NULL)`))
	// The FIFO group delivers its head.
	require.Equal(t, []string{"f1"}, read(`SELECT message_id FROM streamd.queue_receive('f', 10, NULL, NULL)`))
	// The dead letter goes back to its origin's partition.
	var moved int
	require.NoError(t, conn.QueryRow(ctx, `SELECT streamd.queue_redrive('dlq', 10, NULL)`).Scan(&moved))
	require.Equal(t, 1, moved)
	require.Equal(t, []string{"m0"}, read(`SELECT message_id FROM streamd.queue_messages WHERE message_id = 'm0'
		AND origin_stream IS NULL AND tableoid = format('streamd.%I', 'queue_messages_' || md5('q'))::regclass`))
	// A new queue gets its partition, and takes sends.
	_, err = conn.Exec(ctx, `SELECT streamd.queue_create('new', false, 30000, 5, NULL, 262144)`)
	require.NoError(t, err)
	require.Equal(t, []string{"1"}, read(`SELECT "offset"::text FROM streamd.queue_send('new', ARRAY['n1'],
		ARRAY['{}'], NULL, NULL, NULL, NULL, NULL, NULL, NULL)`))
}

// TestMigration0215KeepsOtherRolesGrants: migration 0215 drops and makes again
// streamd.queue_messages and the view streamd.messages; a role that is not bound to a
// tenant keeps what it was granted on them (a send-only producer's INSERT on the
// storage, docs/tenants.md "Any other role"; a reader's SELECT on the view), as the
// bound roles keep theirs.
func TestMigration0215KeepsOtherRolesGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connectBefore(t, 215)
	role := strings.ReplaceAll(testdb.Name("streamd_sendonly"), "-", "_")
	ident := pgx.Identifier{role}.Sanitize()
	_, err := conn.Exec(ctx, "CREATE ROLE "+ident+" NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "DROP OWNED BY "+ident+"; DROP ROLE IF EXISTS "+ident)
	})
	_, err = conn.Exec(ctx, "GRANT INSERT ON streamd.queue_messages TO "+ident+"; GRANT SELECT ON streamd.messages TO "+ident)
	require.NoError(t, err)

	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)

	var insert, selectView bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT has_table_privilege($1, 'streamd.queue_messages', 'INSERT'),
		has_table_privilege($1, 'streamd.messages', 'SELECT')`, role).Scan(&insert, &selectView))
	require.True(t, insert, "the send-only role's INSERT on the storage")
	require.True(t, selectView, "the reader's SELECT on the view")
}
