package schema_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	schema "github.com/streamd/streamd/sql"
)

// TestMigration0195KeepsTheGroupsInFlight: migration 0195 moves a FIFO group's lease
// from visible_at to lease_end, a column of no index. On a database at the schema
// before it, with a group in flight (its visible_at at its lease's end, as receives
// wrote it), a group whose receiver died (its lease over) and a ready group, every
// group and message is still there afterwards; a receive takes the ready group's head
// and the dead receiver's message again, not the group in flight; the lease taken
// before the migration acks with its token, and its group's next message follows.
func TestMigration0195KeepsTheGroupsInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connectBefore(t, 195)

	_, err := conn.Exec(ctx, `
		INSERT INTO streamd.queues (queue_name, fifo, max_delivery_attempts) VALUES ('f', true, 5);
		INSERT INTO streamd.message_groups (stream_name, group_key, tenant_id, visible_at) VALUES
			('f', 'leased', '', now() + interval '1 hour'),
			('f', 'dead', '', now() - interval '1 min'),
			('f', 'ready', '', now() - interval '2 min');
		INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, enqueued_at, visibility_timeout,
		                                    delivery_attempts, lease_token, group_key) VALUES
			('f', 1, 'leased-1', '{}', now() - interval '5 min', now() + interval '1 hour', 1,
			 '00000000-0000-0000-0000-000000000001', 'leased'),
			('f', 2, 'dead-1', '{}', now() - interval '5 min', now() - interval '1 min', 1,
			 '00000000-0000-0000-0000-000000000002', 'dead'),
			('f', 3, 'ready-1', '{}', now() - interval '5 min', now() - interval '5 min', 0, NULL, 'ready'),
			('f', 4, 'leased-2', '{}', now() - interval '5 min', now() - interval '5 min', 0, NULL, 'leased'),
			('f', 5, 'ready-2', '{}', now() - interval '5 min', now() - interval '5 min', 0, NULL, 'ready')`)
	require.NoError(t, err)

	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)

	var groups, msgs int
	require.NoError(t, conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM streamd.message_groups WHERE stream_name = 'f'),
		(SELECT count(*) FROM streamd.queue_messages WHERE stream_name = 'f')`).Scan(&groups, &msgs))
	require.Equal(t, []int{3, 5}, []int{groups, msgs}, "every group and message kept")

	receive := func(max int) []string {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT message_id FROM streamd.queue_receive('f', $1, NULL, NULL) ORDER BY "offset"`, max)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return ids
	}
	require.Equal(t, []string{"dead-1", "ready-1"}, receive(10),
		"the ready group's head and the dead receiver's message; not the group in flight")
	require.Empty(t, receive(10), "every group has its head in flight")

	var acked int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_ack('f', ARRAY[1]::bigint[],
		ARRAY['00000000-0000-0000-0000-000000000001']::uuid[], NULL)`).Scan(&acked))
	require.Equal(t, 1, acked, "the lease taken before the migration settles")
	require.Equal(t, []string{"leased-2"}, receive(10), "its group's next message, in order")
}
