package messages_test

import (
	"context"
	"strings"
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

// TestCommonReceiveAndAckCallNoFunction: the common receive and ack of a standard
// queue are client statements on the queue's partition (direct.go), not calls of
// queue_receive and queue_ack, and PostgreSQL keeps their generic plans (queue13's
// trap: a custom plan costed cheaper is made again at every call). On one connection,
// after eight receives and acks of 10, pg_prepared_statements holds no call of either
// function, and each direct statement ran on its cached generic plan.
func TestCommonReceiveAndAckCallNoFunction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := onePool(t)
	c := newClient(t, pool, nil)
	q := newQueue(t, pool, nil)

	msgs := make([]messages.OutgoingMessage, 80)
	for i := range msgs {
		msgs[i] = messages.OutgoingMessage{Data: data(i)}
	}
	_, err := c.Send(ctx, q, msgs...)
	require.NoError(t, err)
	for range 8 {
		got, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
		require.NoError(t, err)
		require.Len(t, got, 10)
		rs := make([]messages.Receipt, len(got))
		for i, m := range got {
			rs[i] = m.Receipt
		}
		require.NoError(t, c.Ack(ctx, rs...))
	}

	rows, err := pool.Query(ctx, `SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements`)
	require.NoError(t, err)
	defer rows.Close() // before the pool's Close, which waits for its connection
	direct := 0
	for rows.Next() {
		var stmt string
		var generic, custom int64
		require.NoError(t, rows.Scan(&stmt, &generic, &custom))
		require.NotContains(t, stmt, "queue_receive(", "the common receive calls no function")
		require.NotContains(t, stmt, "queue_ack(", "the common ack calls no function")
		if strings.Contains(stmt, "queue_messages_") {
			direct++
			require.GreaterOrEqual(t, generic, int64(2), "a direct statement keeps its generic plan: %s", stmt)
			require.LessOrEqual(t, custom, int64(5), "a direct statement keeps its generic plan: %s", stmt)
		}
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 2, direct, "the receive and the ack on the partition")
}
