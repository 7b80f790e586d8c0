package messages_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// deadLetterOf returns the record of message id in dlq (any status).
func deadLetterOf(t *testing.T, c *messages.Client, dlq, id string) messages.DeadLetter {
	t.Helper()
	all, err := c.DeadLetters(context.Background(), dlq, "")
	require.NoError(t, err)
	for _, d := range all {
		if d.MessageID == id {
			return d
		}
	}
	t.Fatalf("no dead letter %s in %s", id, dlq)
	return messages.DeadLetter{}
}

// failAll receives every visible message of q and nacks it with error e.
func failAll(t *testing.T, c *messages.Client, q string, n int, e string) {
	t.Helper()
	ctx := context.Background()
	got, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 100})
	require.NoError(t, err)
	require.Len(t, got, n)
	for _, m := range got {
		require.NoError(t, c.Nack(ctx, &messages.NackOpts{Error: e}, m.Receipt))
	}
}

// TestQueueDeadLetterVocabulary: queue dead letters have the group dead letters'
// vocabulary. Moving a message to its dead-letter queue records it (pending, origin,
// error, attempts, first and last failure); replaying one by id moves it back to its
// queue (replayed, by whom, when); failing there again brings it back to the same
// record (pending, attempts added); discard and resolve delete it from the
// dead-letter queue with their status; a bulk redrive marks what it moved replayed;
// a dead letter a consumer of the dead-letter queue acked reads as resolved; a
// settled record is not settled again; bad input writes nothing.
func TestQueueDeadLetterVocabulary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, q, dlq := setupDLQ(t, newFakeClock(), 1)
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(id), MessageID: id})
		require.NoError(t, err)
	}
	failAll(t, c, q, 5, "boom")
	pending, err := c.DeadLetters(ctx, dlq, "pending")
	require.NoError(t, err)
	require.Len(t, pending, 5)
	a := deadLetterOf(t, c, dlq, "a")
	require.Equal(t, q, a.OriginQueue)
	require.NotNil(t, a.OriginOffset)
	require.NotNil(t, a.Offset)
	require.Equal(t, "boom", a.Error)
	require.Equal(t, 1, a.Attempts)
	require.Equal(t, "pending", a.Status)

	// Replay by id: back in q, replayed by alice.
	got, err := c.ReplayDeadLetters(ctx, dlq, "alice", "a")
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, got)
	a = deadLetterOf(t, c, dlq, "a")
	require.Equal(t, "replayed", a.Status)
	require.Equal(t, "alice", a.ResolvedBy)
	require.NotNil(t, a.ResolvedAt)
	require.Nil(t, a.Offset, "no longer in the dead-letter queue")
	got, err = c.ReplayDeadLetters(ctx, dlq, "alice", "a")
	require.NoError(t, err)
	require.Empty(t, got, "replayed once")
	// It fails again: the same record, pending, attempts added.
	failAll(t, c, q, 1, "boom again")
	a = deadLetterOf(t, c, dlq, "a")
	require.Equal(t, "pending", a.Status)
	require.Equal(t, 2, a.Attempts)
	require.Equal(t, "boom again", a.Error)
	require.Empty(t, a.ResolvedBy)

	// Discard and resolve delete from the dead-letter queue, each with its status.
	got, err = c.DiscardDeadLetters(ctx, dlq, "bob", "b")
	require.NoError(t, err)
	require.Equal(t, []string{"b"}, got)
	got, err = c.ResolveDeadLetters(ctx, dlq, "carol", "c", "no-such-id")
	require.NoError(t, err)
	require.Equal(t, []string{"c"}, got)
	require.Equal(t, "discarded", deadLetterOf(t, c, dlq, "b").Status)
	require.Equal(t, "bob", deadLetterOf(t, c, dlq, "b").ResolvedBy)
	require.Equal(t, "resolved", deadLetterOf(t, c, dlq, "c").Status)
	require.Equal(t, "carol", deadLetterOf(t, c, dlq, "c").ResolvedBy)
	got, err = c.DiscardDeadLetters(ctx, dlq, "bob", "c")
	require.NoError(t, err)
	require.Empty(t, got, "a resolved dead letter is not discarded")

	// A consumer of the dead-letter queue acks d: it reads as resolved, by nobody.
	dm, err := c.Receive(ctx, dlq, &messages.ReceiveOpts{Max: 100})
	require.NoError(t, err)
	for _, m := range dm {
		if m.MessageID == "d" {
			require.NoError(t, c.Ack(ctx, m.Receipt))
		} else {
			require.NoError(t, c.Release(ctx, m.Receipt))
		}
	}
	d := deadLetterOf(t, c, dlq, "d")
	require.Equal(t, "resolved", d.Status)
	require.Empty(t, d.ResolvedBy)

	// A bulk redrive marks what it moved replayed (e and a).
	n, err := c.Redrive(ctx, dlq, nil)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, "replayed", deadLetterOf(t, c, dlq, "e").Status)
	require.Equal(t, "replayed", deadLetterOf(t, c, dlq, "a").Status)
	replayed, err := c.DeadLetters(ctx, dlq, "replayed")
	require.NoError(t, err)
	require.Len(t, replayed, 2)

	// Bad input.
	_, err = c.DeadLetters(ctx, dlq, "bogus")
	require.ErrorIs(t, err, messages.ErrInvalidArgument)
	_, err = c.DeadLetters(ctx, testdb.Name("nope"), "")
	require.ErrorIs(t, err, messages.ErrQueueNotFound)
	_, err = c.ResolveDeadLetters(ctx, testdb.Name("nope"), "x", "a")
	require.ErrorIs(t, err, messages.ErrQueueNotFound)
}
