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

// A plain INSERT INTO streamd.messages (seed 003's table) goes through what Send does:
// the queue's max attempts and dead-letter queue apply (the case: a queue with
// 2 attempts and a dead-letter queue got 5 and none), a message id the queue holds is
// a duplicate (nothing stored, and Send reports the original), and the message is
// delivered and dead-lettered as a sent one.
func TestPlainInsertAppliesQueueSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	dlq := newQueue(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{DeadLetterQueue: dlq, MaxDeliveryAttempts: 2})

	// Seed 003's columns.
	tag, err := pool.Exec(ctx, `INSERT INTO streamd.messages (message_id, stream_name, data, metadata) VALUES ('m1', $1, '{"a": 1}', '{"k": "v"}')`, q)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	var attempts int
	var dead *string
	require.NoError(t, pool.QueryRow(ctx, `SELECT max_delivery_attempts, dead_letter_stream FROM streamd.messages
		WHERE stream_name = $1 AND message_id = 'm1'`, q).Scan(&attempts, &dead))
	require.Equal(t, 2, attempts)
	require.NotNil(t, dead)
	require.Equal(t, dlq, *dead)

	// Dedup: the same id again stores nothing, by SQL or by Send.
	tag, err = pool.Exec(ctx, `INSERT INTO streamd.messages (message_id, stream_name, data) VALUES ('m1', $1, '{"a": 2}')`, q)
	require.NoError(t, err)
	require.EqualValues(t, 0, tag.RowsAffected())
	again, err := c.Send(ctx, q, messages.OutgoingMessage{MessageID: "m1", Data: data(3)})
	require.NoError(t, err)
	require.True(t, again[0].Duplicate)
	require.Equal(t, 1, count(t, pool, q))

	// Two deliveries, then the dead-letter queue.
	for i := 1; i <= 2; i++ {
		m, err := c.Receive(ctx, q, nil)
		require.NoError(t, err)
		require.Len(t, m, 1)
		require.Equal(t, i, m[0].DeliveryAttempts)
		require.Equal(t, 2, m[0].MaxDeliveryAttempts)
		require.JSONEq(t, `{"a": 1}`, string(m[0].Data))
		require.Equal(t, map[string]string{"k": "v"}, m[0].Headers)
		require.NoError(t, c.Nack(ctx, &messages.NackOpts{Error: "boom"}, m[0].Receipt))
	}
	require.Equal(t, 0, count(t, pool, q))
	moved, err := c.Receive(ctx, dlq, nil)
	require.NoError(t, err)
	require.Len(t, moved, 1)
	require.Equal(t, "m1", moved[0].MessageID)
	require.NotNil(t, moved[0].Origin)
	require.Equal(t, q, moved[0].Origin.Queue)

	// A value the insert gives is the message's own, as Send's per-message overrides.
	_, err = pool.Exec(ctx, `INSERT INTO streamd.messages (stream_name, data, max_delivery_attempts) VALUES ($1, '{}', 7)`, q)
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, `SELECT max_delivery_attempts FROM streamd.messages WHERE stream_name = $1`, q).Scan(&attempts))
	require.Equal(t, 7, attempts)
}

// Bad input in a plain INSERT gets Send's typed error and writes nothing.
func TestPlainInsertRefusesBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	q := newQueue(t, pool, &messages.QueueConfig{MaxPayloadBytes: 64})
	fifo := newQueue(t, pool, &messages.QueueConfig{FIFO: true})
	missing := testdb.Name("missing")
	for _, tc := range []struct {
		name, sql string
		args      []any
		want      error
		contains  string
	}{
		{"unknown queue", `INSERT INTO streamd.messages (message_id, stream_name, data) VALUES ('x', $1, '{}')`, []any{missing}, messages.ErrQueueNotFound, missing},
		{"invalid queue name", `INSERT INTO streamd.messages (message_id, stream_name, data) VALUES ('x', 'no spaces', '{}')`, nil, messages.ErrInvalidName, "no spaces"},
		{"payload over the queue's limit", `INSERT INTO streamd.messages (message_id, stream_name, data) VALUES ('x', $1, to_jsonb(repeat('a', 100)))`, []any{q}, messages.ErrPayloadTooLarge, "allows 64"},
		{"empty message id", `INSERT INTO streamd.messages (message_id, stream_name, data) VALUES ('', $1, '{}')`, []any{q}, messages.ErrInvalidArgument, "message id"},
		{"zero attempts", `INSERT INTO streamd.messages (stream_name, data, max_delivery_attempts) VALUES ($1, '{}', 0)`, []any{q}, messages.ErrInvalidArgument, "at least 1"},
		{"unknown dead-letter queue", `INSERT INTO streamd.messages (stream_name, data, dead_letter_stream) VALUES ($1, '{}', $2)`, []any{q, missing}, messages.ErrQueueNotFound, missing},
		{"group key on a standard queue", `INSERT INTO streamd.messages (stream_name, data, group_key) VALUES ($1, '{}', 'g')`, []any{q}, messages.ErrInvalidArgument, "needs a FIFO queue"},
		{"FIFO without a group key", `INSERT INTO streamd.messages (stream_name, data) VALUES ($1, '{}')`, []any{fifo}, messages.ErrInvalidArgument, "group key"},
		{"a lease", `INSERT INTO streamd.messages (stream_name, data, lease_token) VALUES ($1, '{}', gen_random_uuid())`, []any{q}, messages.ErrInvalidArgument, "lease_token"},
		{"headers not an object", `INSERT INTO streamd.messages (stream_name, data, metadata) VALUES ($1, '{}', '[1]')`, []any{q}, messages.ErrInvalidArgument, "JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pool.Exec(ctx, tc.sql, tc.args...)
			err = sqlerr.Wrap(err)
			require.ErrorIs(t, err, tc.want)
			require.ErrorContains(t, err, tc.contains)
		})
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.messages WHERE stream_name = ANY($1)`,
		[]string{q, fifo, missing}).Scan(&n))
	require.Zero(t, n, "nothing written")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.message_groups WHERE stream_name = $1`, fifo).Scan(&n))
	require.Zero(t, n, "no group row either")
}

// A plain INSERT into a FIFO queue makes the message's group row, so it is delivered
// (without the row it never was), in order within its group.
func TestPlainInsertFIFOIsDelivered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{FIFO: true})
	_, err := pool.Exec(ctx, `INSERT INTO streamd.messages (stream_name, message_id, data, group_key)
		VALUES ($1, 'a1', '1', 'a'), ($1, 'a2', '2', 'a')`, q)
	require.NoError(t, err)
	m, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
	require.NoError(t, err)
	require.Len(t, m, 1, "one message of a group in flight")
	require.Equal(t, "a1", m[0].MessageID)
	require.NoError(t, c.Ack(ctx, m[0].Receipt))
	m, err = c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
	require.NoError(t, err)
	require.Len(t, m, 1)
	require.Equal(t, "a2", m[0].MessageID)
	require.True(t, strings.HasPrefix(string(m[0].Data), "2"))
}
