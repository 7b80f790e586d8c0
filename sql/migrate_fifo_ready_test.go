package schema_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
)

// TestMigration0175KeepsTheFIFOGroups: migration 0175 replaces message_groups'
// index of ready groups (stream_name, visible_at) with one in the receive's order
// (stream_name, visible_at, group_key). On a database at the schema before it, with
// a FIFO queue whose groups are ready, in flight and empty of ready messages, every
// group and message is still there afterwards; a receive takes the ready groups'
// heads in the old order (least recently served first, then by key), the lease
// taken before the migration still acks with its token, and its group's next
// message is received after it.
func TestMigration0175KeepsTheFIFOGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connectBefore(t, 175)

	_, err := conn.Exec(ctx, `
		INSERT INTO streamd.queues (queue_name, fifo, max_delivery_attempts) VALUES ('f', true, 5);
		INSERT INTO streamd.message_groups (stream_name, group_key, tenant_id, visible_at) VALUES
			('f', 'b', '', now() - interval '2 min'),
			('f', 'a', '', now() - interval '2 min'),
			('f', 'c', '', now() - interval '3 min'),
			('f', 'leased', '', now() + interval '1 hour');
		INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, enqueued_at, visibility_timeout,
		                                    delivery_attempts, lease_token, group_key) VALUES
			('f', 1, 'leased-1', '{}', now() - interval '5 min', now() + interval '1 hour', 1,
			 '00000000-0000-0000-0000-000000000001', 'leased'),
			('f', 2, 'a-1', '{}', now() - interval '5 min', now() - interval '5 min', 0, NULL, 'a'),
			('f', 3, 'b-1', '{}', now() - interval '5 min', now() - interval '5 min', 0, NULL, 'b'),
			('f', 4, 'c-1', '{}', now() - interval '5 min', now() - interval '5 min', 0, NULL, 'c'),
			('f', 5, 'leased-2', '{}', now() - interval '5 min', now() - interval '5 min', 0, NULL, 'leased'),
			('f', 6, 'a-2', '{}', now() - interval '5 min', now() - interval '5 min', 0, NULL, 'a')`)
	require.NoError(t, err)

	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)

	var indexes []string
	rows, err := conn.Query(ctx, `SELECT indexname FROM pg_indexes WHERE schemaname = 'streamd' AND tablename = 'message_groups' ORDER BY 1`)
	require.NoError(t, err)
	indexes, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"message_groups_pkey", "message_groups_ready"}, indexes)
	var groups, msgs int
	require.NoError(t, conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM streamd.message_groups WHERE stream_name = 'f'),
		(SELECT count(*) FROM streamd.queue_messages WHERE stream_name = 'f')`).Scan(&groups, &msgs))
	require.Equal(t, []int{4, 6}, []int{groups, msgs}, "every group and message kept")

	receive := func(max int) []string {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT message_id FROM streamd.queue_receive('f', $1, NULL, NULL)`, max)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return ids
	}
	// One group at a time, to see the order in which they are served.
	require.Equal(t, []string{"c-1"}, receive(1), "the least recently served group first")
	require.Equal(t, []string{"a-1"}, receive(1), "then by key among groups served at one time")
	require.Equal(t, []string{"b-1"}, receive(1))
	require.Empty(t, receive(10), "each ready group has its head in flight; the group leased before is not due")

	var acked int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_ack('f', ARRAY[1]::bigint[],
		ARRAY['00000000-0000-0000-0000-000000000001']::uuid[], NULL)`).Scan(&acked))
	require.Equal(t, 1, acked, "the lease taken before the migration settles")
	require.Equal(t, []string{"leased-2"}, receive(10), "its group's next message, in order")
}

// TestMigration0175RebuildsAnInvalidIndex: an index named message_groups_ready left
// INVALID (a CREATE INDEX CONCURRENTLY built beforehand, as docs/operations.md
// suggests, that failed) is built again by migration 0175, so the migration never
// drops the old index without a usable new one.
func TestMigration0175RebuildsAnInvalidIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.FreshDatabase(t))
	require.NoError(t, err)
	defer conn.Close(ctx)

	migrateBefore(ctx, t, conn, 175)
	// What a failed concurrent build leaves: the index, marked invalid.
	_, err = conn.Exec(ctx, `CREATE INDEX message_groups_ready ON streamd.message_groups (stream_name, visible_at, group_key);
		UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'streamd.message_groups_ready'::regclass`)
	require.NoError(t, err)

	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)
	var valid bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'streamd.message_groups_ready'::regclass`).Scan(&valid))
	require.True(t, valid, "the ready index is usable after the migration")
}
