package schema_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	schema "github.com/streamd/streamd/sql"
)

// TestMigration0200KeepsTheFIFOGroups: from migration 0200 on, a FIFO ack writes no
// group row, so a group whose head is leased must not wait past now. On a database at
// the schema before it, with a group in flight as a receive before migration 0195 left
// it (visible_at at its lease's end), one as a receive after it left it (lease_end
// set), a group whose head is delayed, a ready group and a dead letter of the queue,
// every group and message is still there afterwards and lease_end is gone; a receive
// takes the ready group's head only; each lease taken before the migration acks with
// its token and its group's next message follows at once (not at the old lease's
// end); the delayed group stays delayed; the dead letter is redriven into its group
// and delivered after the message before it.
func TestMigration0200KeepsTheFIFOGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connectBefore(t, 200)

	_, err := conn.Exec(ctx, `
		CREATE SEQUENCE streamd.f_offsets START 7; -- the queue's own offsets (no trigger before the functions)
		INSERT INTO streamd.queues (queue_name, fifo, max_delivery_attempts, offset_seq) VALUES
			('f', true, 5, 'streamd.f_offsets'), ('d', false, 5, NULL);
		INSERT INTO streamd.message_groups (stream_name, group_key, tenant_id, visible_at, lease_end) VALUES
			('f', 'old', '', now() + interval '1 hour', NULL),
			('f', 'marked', '', now() - interval '1 min', now() + interval '1 hour'),
			('f', 'delayed', '', now() + interval '1 hour', NULL),
			('f', 'ready', '', now() - interval '2 min', NULL);
		INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, enqueued_at, visibility_timeout,
		                                    delivery_attempts, lease_token, group_key) VALUES
			('f', 1, 'old-1', '{}', now() - interval '5 min', now() + interval '1 hour', 1,
			 '00000000-0000-0000-0000-000000000001', 'old'),
			('f', 2, 'marked-1', '{}', now() - interval '5 min', now() + interval '1 hour', 1,
			 '00000000-0000-0000-0000-000000000002', 'marked'),
			('f', 3, 'delayed-1', '{}', now() - interval '5 min', now() + interval '1 hour', 0, NULL, 'delayed'),
			('f', 4, 'ready-1', '{}', now() - interval '5 min', now() - interval '5 min', 0, NULL, 'ready'),
			('f', 5, 'old-2', '{}', now() - interval '5 min', now() - interval '5 min', 0, NULL, 'old'),
			('f', 6, 'marked-2', '{}', now() - interval '5 min', now() - interval '5 min', 0, NULL, 'marked');
		INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, enqueued_at, visibility_timeout,
		                                    delivery_attempts, group_key, origin_stream, origin_offset,
		                                    origin_attempts, dead_lettered_at, last_error) VALUES
			('d', 1, 'ready-0', '{}', now() - interval '9 min', now() - interval '9 min', 0, 'ready', 'f', 0, 5,
			 now() - interval '8 min', 'failed')`)
	require.NoError(t, err)

	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)

	var groups, msgs, dead, cols int
	require.NoError(t, conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM streamd.message_groups WHERE stream_name = 'f'),
		(SELECT count(*) FROM streamd.queue_messages WHERE stream_name = 'f'),
		(SELECT count(*) FROM streamd.queue_messages WHERE stream_name = 'd'),
		(SELECT count(*) FROM information_schema.columns WHERE table_schema = 'streamd'
		   AND table_name = 'message_groups' AND column_name = 'lease_end')`).Scan(&groups, &msgs, &dead, &cols))
	require.Equal(t, []int{4, 6, 1, 0}, []int{groups, msgs, dead, cols}, "every group and message kept; lease_end gone")

	receive := func(max int) []string {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT message_id FROM streamd.queue_receive('f', $1, NULL, NULL) ORDER BY "offset"`, max)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return ids
	}
	ack := func(off int64, tok string) {
		t.Helper()
		var acked int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_ack('f', ARRAY[$1::bigint],
			ARRAY[$2::uuid], NULL)`, off, tok).Scan(&acked))
		require.Equal(t, 1, acked, "the lease taken before the migration settles")
	}
	require.Equal(t, []string{"ready-1"}, receive(10), "the ready group's head; not the groups in flight nor the delayed one")
	require.Empty(t, receive(10), "every group has its head in flight or delayed")

	ack(1, "00000000-0000-0000-0000-000000000001")
	require.Equal(t, []string{"old-2"}, receive(10), "its group's next message, at once")
	ack(2, "00000000-0000-0000-0000-000000000002")
	require.Equal(t, []string{"marked-2"}, receive(10), "its group's next message, at once")

	var moved int
	require.NoError(t, conn.QueryRow(ctx, `SELECT streamd.queue_redrive('d', 10, NULL)`).Scan(&moved))
	require.Equal(t, 1, moved)
	var readyTok string
	require.NoError(t, conn.QueryRow(ctx, `SELECT lease_token::text FROM streamd.queue_messages
		WHERE stream_name = 'f' AND message_id = 'ready-1'`).Scan(&readyTok))
	ack(4, readyTok)
	require.Equal(t, []string{"ready-0"}, receive(10), "the redriven dead letter, after the message before it")
	require.Empty(t, receive(10), "the delayed group is still delayed")
}
