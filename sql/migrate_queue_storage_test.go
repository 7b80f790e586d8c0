package schema_test

import (
	"context"
	"io/fs"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
)

// TestMigration0086MovesEveryMessage: migration 0086 moves the queues' messages from
// the table streamd.messages into streamd.queue_messages (and makes streamd.messages a
// view of it) without losing or changing one: on a database at the schema before it,
// with messages ready, in flight, with an expired lease, delayed, nacked with a delay,
// dead-lettered with their provenance, in a FIFO group, of a tenant, with headers,
// per-message overrides, a dedup id and a binary payload, every message reads the same
// through the view afterwards, and the queue functions go on from there: the in-flight
// lease still acks with its token, receive delivers what was visible and nothing else,
// the dead letter redrives, and new offsets follow the old global sequence's.
func TestMigration0086MovesEveryMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connectBefore(t, 86)

	_, err := conn.Exec(ctx, `
		INSERT INTO streamd.queues (queue_name, fifo, max_delivery_attempts, dead_letter_queue) VALUES
			('dlq', false, 5, NULL), ('q', false, 3, 'dlq'), ('f', true, 5, NULL);
		SELECT setval('streamd.messages_offset_seq', 100);
		INSERT INTO streamd.messages (stream_name, "offset", message_id, data, metadata, enqueued_at, visibility_timeout,
		                              not_before, delivery_attempts, max_delivery_attempts, dead_letter_stream, lease_token,
		                              group_key, last_error, origin_stream, origin_offset, origin_attempts,
		                              dead_lettered_at, dedup, tenant_id, data_bytes) VALUES
			-- ready
			('q', 1, 'm1', '{"n":1}', NULL, now() - interval '2 min', now() - interval '1 min', now() - interval '1 min',
			 0, 3, 'dlq', NULL, NULL, NULL, NULL, NULL, NULL, NULL, false, NULL, NULL),
			-- in flight
			('q', 2, 'm2', '{"n":2}', NULL, now() - interval '2 min', now() + interval '10 min', now() - interval '1 min',
			 1, 3, 'dlq', '00000000-0000-0000-0000-000000000002', NULL, NULL, NULL, NULL, NULL, NULL, false, NULL, NULL),
			-- delayed at send
			('q', 3, 'm3', '{"n":3}', NULL, now(), now() + interval '1 hour', now() + interval '1 hour',
			 0, 3, 'dlq', NULL, NULL, NULL, NULL, NULL, NULL, NULL, false, NULL, NULL),
			-- nacked with a delay
			('q', 4, 'm4', '{"n":4}', NULL, now() - interval '2 min', now() + interval '5 min', now() + interval '5 min',
			 2, 3, 'dlq', NULL, NULL, 'boom', NULL, NULL, NULL, NULL, false, NULL, NULL),
			-- an expired lease: visible, and its token still acks until a new receive
			('q', 5, 'm5', '{"n":5}', NULL, now() - interval '2 min', now() - interval '1 s', now() - interval '1 min',
			 1, 3, 'dlq', '00000000-0000-0000-0000-000000000005', NULL, NULL, NULL, NULL, NULL, NULL, false, NULL, NULL),
			-- a tenant's, with headers, its own attempts and a dedup id
			('q', 8, 'order-1', '{"n":8}', '{"k":"v"}', now() - interval '2 min', now() - interval '1 min', now() - interval '1 min',
			 0, 9, 'dlq', NULL, NULL, NULL, NULL, NULL, NULL, NULL, true, 'acme', NULL),
			-- binary
			('q', 9, 'm9', NULL, NULL, now() - interval '2 min', now() - interval '1 min', now() - interval '1 min',
			 0, 3, 'dlq', NULL, NULL, NULL, NULL, NULL, NULL, NULL, false, NULL, '\x0001'),
			-- a dead letter with its provenance
			('dlq', 6, 'm0', '{"n":0}', NULL, now() - interval '3 min', now() - interval '1 min', now() - interval '1 min',
			 0, 5, NULL, NULL, NULL, 'gave up', 'q', 0, 3, now() - interval '1 min', false, NULL, NULL),
			-- FIFO
			('f', 7, 'm7', '{"n":7}', NULL, now() - interval '2 min', now() - interval '1 min', now() - interval '1 min',
			 0, 5, NULL, NULL, 'g', NULL, NULL, NULL, NULL, NULL, false, 'acme', NULL);
		INSERT INTO streamd.message_groups (stream_name, group_key, tenant_id, visible_at)
			VALUES ('f', 'g', 'acme', now() - interval '1 min');`)
	require.NoError(t, err)

	const seedColumns = `stream_name, "offset", message_id, data, metadata, enqueued_at, visibility_timeout,
		delivery_attempts, max_delivery_attempts, dead_letter_stream, lease_token, group_key, last_error,
		origin_stream, origin_offset, origin_attempts, dead_lettered_at, dedup, tenant_id, data_bytes`
	read := func() []string {
		rows, err := conn.Query(ctx, `SELECT m::text FROM (SELECT `+seedColumns+` FROM streamd.messages ORDER BY 1, 2) m`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	before := read()
	require.Len(t, before, 9)

	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)

	require.Equal(t, before, read(), "every message, as it was, through the view")
	var kind string
	require.NoError(t, conn.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'streamd.messages'::regclass`).Scan(&kind))
	require.Equal(t, "v", kind)
	var globalSeq *string
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass('streamd.messages_offset_seq')::text`).Scan(&globalSeq))
	require.Nil(t, globalSeq, "no global offset sequence")
	var noSeq int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM streamd.queues WHERE offset_seq IS NULL`).Scan(&noSeq))
	require.Zero(t, noSeq, "every queue has its offsets' sequence")

	// The lease in flight still settles with its token.
	var acked int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_ack('q', ARRAY[2::bigint],
		ARRAY['00000000-0000-0000-0000-000000000002'::uuid], NULL)`).Scan(&acked))
	require.Equal(t, 1, acked)
	// What was visible is delivered, in offset order; delayed and nacked messages are not.
	rows, err := conn.Query(ctx, `SELECT "offset" FROM streamd.queue_receive('q', 10, NULL, NULL) ORDER BY 1`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{1, 5, 8, 9}, got)
	var stats string
	require.NoError(t, conn.QueryRow(ctx, `SELECT format('%s/%s/%s/%s/%s', depth, in_flight, delayed, total, dead_lettered)
		FROM streamd.queue_stats('q', NULL)`).Scan(&stats))
	require.Equal(t, "0/4/2/6/1", stats)
	// The FIFO group delivers its head.
	var fifoOff int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT "offset" FROM streamd.queue_receive('f', 10, NULL, NULL)`).Scan(&fifoOff))
	require.Equal(t, int64(7), fifoOff)
	// The dead letter goes back to its origin, with an offset after every old one.
	var moved int
	require.NoError(t, conn.QueryRow(ctx, `SELECT streamd.queue_redrive('dlq', 10, NULL)`).Scan(&moved))
	require.Equal(t, 1, moved)
	var back int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT "offset" FROM streamd.messages WHERE stream_name = 'q' AND message_id = 'm0'`).Scan(&back))
	require.Greater(t, back, int64(100))
	// A new send too, and the dedup id still holds.
	rows, err = conn.Query(ctx, `SELECT "offset", duplicate FROM streamd.queue_send('q', ARRAY['order-1', 'new'],
		ARRAY['{}', '{}'], NULL, NULL, NULL, NULL, NULL, NULL, NULL) ORDER BY ord`)
	require.NoError(t, err)
	type sent struct {
		Offset    int64
		Duplicate bool
	}
	res, err := pgx.CollectRows(rows, pgx.RowToStructByPos[sent])
	require.NoError(t, err)
	require.Equal(t, sent{8, true}, res[0])
	require.Greater(t, res[1].Offset, back)
	require.False(t, res[1].Duplicate)
}

// migrateBefore brings conn's database to the schema before migration version: the
// migrations below it and none of the re-applied layer (its functions and views are
// today's, written for the schema after it).
// connectBefore returns a connection to a fresh database migrated to the schema
// before migration version (migrateBefore), closed when the test ends.
func connectBefore(t *testing.T, version int) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.FreshDatabase(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	migrateBefore(ctx, t, conn, version)
	return conn
}

func migrateBefore(ctx context.Context, t *testing.T, conn *pgx.Conn, version int) {
	t.Helper()
	old := fstest.MapFS{"functions/none": {}, "views/none": {}}
	require.NoError(t, fs.WalkDir(schema.Files, "migrations", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		v, err := strconv.Atoi(strings.SplitN(d.Name(), "_", 2)[0])
		if err != nil || v >= version {
			return err
		}
		b, err := fs.ReadFile(schema.Files, p)
		old[p] = &fstest.MapFile{Data: b}
		return err
	}))
	_, err := schema.MigrateFS(ctx, conn, old)
	require.NoError(t, err)
}
