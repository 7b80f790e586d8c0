package messages_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// TestQueuePartitionGoesWithTheQueue: each queue's messages are a partition of
// streamd.queue_messages of its own (migration 0215), made with the queue's row and
// dropped with it, as its sequence is: the partition holds the queue's messages, has
// its own primary key on "offset", fillfactor 50 and row-level security; a plain
// INSERT into queue_messages of a queue that does not exist fails with
// ErrQueueNotFound and writes nothing; after DeleteQueue the partition is gone (no
// other transaction holds the parent here), and the name takes no row.
func TestQueuePartitionGoesWithTheQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	q := newQueue(t, pool, nil)

	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1)})
	require.NoError(t, err)
	var part, pkey, fill string
	var rls bool
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT m.tableoid::regclass::text, pg_get_indexdef(i.indexrelid, 1, true),
		       (SELECT o FROM unnest(c.reloptions) o WHERE o LIKE 'fillfactor%'), c.relrowsecurity
		FROM streamd.queue_messages m JOIN pg_class c ON c.oid = m.tableoid
		JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
		WHERE m.stream_name = $1`, q).Scan(&part, &pkey, &fill, &rls))
	require.NotEqual(t, "streamd.queue_messages", part, "the queue's messages are in a partition of their own")
	require.Equal(t, `"offset"`, pkey)
	require.Equal(t, "fillfactor=50", fill)
	require.True(t, rls)

	missing := q + "-missing"
	_, err = pool.Exec(ctx, `INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, enqueued_at,
		visibility_timeout) VALUES ($1, 1, 'm', '{}', now(), now())`, missing)
	require.ErrorIs(t, sqlerr.Wrap(err), messages.ErrQueueNotFound)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_messages WHERE stream_name = $1`, missing).Scan(&n))
	require.Zero(t, n, "nothing written")

	require.NoError(t, c.DeleteQueue(ctx, q))
	var left *string
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1)::text`, part).Scan(&left))
	require.Nil(t, left, "the partition went with the queue")
	_, err = pool.Exec(ctx, `INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, enqueued_at,
		visibility_timeout) VALUES ($1, 1, 'm', '{}', now(), now())`, q)
	require.ErrorIs(t, sqlerr.Wrap(err), messages.ErrQueueNotFound)
}
