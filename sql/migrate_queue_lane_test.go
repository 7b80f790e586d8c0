package schema_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	schema "github.com/streamd/streamd/sql"
)

// TestMigration0120KeepsTheDelayedLane: migration 0120 indexes the delayed lane by
// due_at instead of visibility_timeout. On a database at the schema before it, with
// lane messages due, not yet due and in flight, every message is still there
// afterwards and a receive takes exactly the due one that is not in flight; the one
// in flight still acks with its token, and is received once its lease has ended.
func TestMigration0120KeepsTheDelayedLane(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connectBefore(t, 120)

	const lane = 4503599627370496
	_, err := conn.Exec(ctx, `
		INSERT INTO streamd.queues (queue_name, fifo, max_delivery_attempts) VALUES ('q', false, 5);
		INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, enqueued_at, visibility_timeout,
		                                    delivery_attempts, lease_token) VALUES
			('q', 1, 'ready', '{}', now() - interval '1 min', now() - interval '1 min', 0, NULL),
			('q', 4503599627370497, 'due', '{}', now() - interval '1 min', now() - interval '1 s', 0, NULL),
			('q', 4503599627370498, 'later', '{}', now() - interval '1 min', now() + interval '1 hour', 0, NULL),
			('q', 4503599627370499, 'leased', '{}', now() - interval '1 min', now() + interval '2 s', 1,
			 '00000000-0000-0000-0000-000000000009')`)
	require.NoError(t, err)

	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)

	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_messages WHERE stream_name = 'q' AND
		("offset" < $1) = (due_at IS NULL)`, lane).Scan(&n))
	require.Equal(t, 4, n, "every message kept, due_at set on the lane's only")
	rows, err := conn.Query(ctx, `SELECT message_id FROM streamd.queue_receive('q', 10, NULL, NULL) ORDER BY "offset"`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"ready", "due"}, ids)

	// The lease taken before the migration still settles; had it ended instead, the
	// message would be received (its due_at is its lease's end).
	var acked int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_ack('q', ARRAY[4503599627370499]::bigint[],
		ARRAY['00000000-0000-0000-0000-000000000009']::uuid[], NULL)`).Scan(&acked))
	require.Equal(t, 1, acked)
	_, err = conn.Exec(ctx, `UPDATE streamd.queue_messages SET visibility_timeout = now() - interval '1 s', lease_token = NULL
		WHERE stream_name = 'q' AND message_id = 'later'`)
	require.NoError(t, err)
	rows, err = conn.Query(ctx, `SELECT message_id FROM streamd.queue_receive('q', 10, NULL, NULL)`)
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, ids, "a lane message is not received before its due_at")
}
