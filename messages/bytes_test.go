package messages_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// Queues carry binary payloads (data_bytes) as the log does: sent, received,
// dead-lettered and redriven unchanged, beside JSON messages; counted against the
// queue's payload limit; a message with both payloads, or none, is refused and
// nothing of its batch is stored.
func TestBinaryPayloads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	dlq := newQueue(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{DeadLetterQueue: dlq, MaxDeliveryAttempts: 1, MaxPayloadBytes: 100})
	raw := []byte{0x00, 0xff, 0x10, 0x80, 'x'}
	_, err := c.Send(ctx, q,
		messages.OutgoingMessage{Bytes: raw, MessageID: "bin", Headers: map[string]string{"content-type": "application/x-protobuf"}},
		messages.OutgoingMessage{Data: data(map[string]int{"a": 1}), MessageID: "json"})
	require.NoError(t, err)
	// The SQL path too.
	_, err = pool.Exec(ctx, `INSERT INTO streamd.messages (stream_name, message_id, data_bytes) VALUES ($1, 'sql-bin', '\x0001')`, q)
	require.NoError(t, err)

	got, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
	require.NoError(t, err)
	require.Len(t, got, 3)
	byID := map[string]*messages.Message{}
	for _, m := range got {
		byID[m.MessageID] = m
	}
	require.True(t, bytes.Equal(raw, byID["bin"].Bytes))
	require.Nil(t, byID["bin"].Data)
	require.Equal(t, "application/x-protobuf", byID["bin"].Headers["content-type"])
	require.JSONEq(t, `{"a":1}`, string(byID["json"].Data))
	require.Nil(t, byID["json"].Bytes)
	require.Equal(t, []byte{0, 1}, byID["sql-bin"].Bytes)

	// Dead-lettered and redriven with its bytes.
	require.NoError(t, c.Nack(ctx, nil, byID["bin"].Receipt))
	dead, err := c.Peek(ctx, dlq, nil)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.True(t, bytes.Equal(raw, dead[0].Bytes))
	n, err := c.Redrive(ctx, dlq, nil)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	back, err := c.Peek(ctx, q, nil)
	require.NoError(t, err)
	found := false
	for _, m := range back {
		if m.MessageID == "bin" {
			found = true
			require.True(t, bytes.Equal(raw, m.Bytes))
		}
	}
	require.True(t, found)

	// Bad input: nothing of the batch is stored.
	before := count(t, pool, q)
	_, err = c.Send(ctx, q, messages.OutgoingMessage{Bytes: []byte{1}}, messages.OutgoingMessage{Bytes: []byte{1}, Data: data(1)})
	require.ErrorIs(t, err, messages.ErrInvalidArgument)
	_, err = c.Send(ctx, q, messages.OutgoingMessage{Bytes: []byte{1}}, messages.OutgoingMessage{Bytes: make([]byte, 101)})
	require.ErrorIs(t, err, messages.ErrPayloadTooLarge)
	_, err = pool.Exec(ctx, `INSERT INTO streamd.messages (stream_name, data, data_bytes) VALUES ($1, '{}', '\x00')`, q)
	require.ErrorIs(t, sqlerr.Wrap(err), messages.ErrInvalidArgument)
	_, err = pool.Exec(ctx, `SELECT * FROM streamd.queue_send($1, NULL, ARRAY['1', NULL], NULL, NULL, NULL, NULL, NULL, NULL, NULL, false, ARRAY['\x00'::bytea, NULL])`, q)
	require.ErrorIs(t, sqlerr.Wrap(err), messages.ErrInvalidArgument)
	require.ErrorContains(t, err, "both data and data_bytes")
	require.Equal(t, before, count(t, pool, q))
}
