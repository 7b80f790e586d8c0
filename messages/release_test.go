package messages_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// TestReleaseKeepsTheAttempt: Release gives a message back at once without spending
// its delivery attempt: at its last attempt it is received again (not dead-lettered),
// with the same attempt number and its place in the queue kept; a stale receipt is
// refused. Standard and FIFO queues.
func TestReleaseKeepsTheAttempt(t *testing.T) {
	t.Parallel()
	for _, fifo := range []bool{false, true} {
		t.Run(map[bool]string{false: "standard", true: "fifo"}[fifo], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			c := newClient(t, pool, nil)
			dlq := newQueue(t, pool, nil)
			q := newQueue(t, pool, &messages.QueueConfig{FIFO: fifo, DeadLetterQueue: dlq, MaxDeliveryAttempts: 1, VisibilityTimeout: time.Hour})
			group := map[bool]string{true: "g"}[fifo]
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1), MessageID: "a", GroupKey: group},
				messages.OutgoingMessage{Data: data(2), MessageID: "b", GroupKey: group})
			require.NoError(t, err)

			for range 3 { // at the last attempt, released again and again
				m, err := c.Receive(ctx, q, nil)
				require.NoError(t, err)
				require.Len(t, m, 1)
				require.Equal(t, "a", m[0].MessageID, "a released message keeps its place")
				require.Equal(t, 1, m[0].DeliveryAttempts, "no attempt spent by a release")
				require.NoError(t, c.Release(ctx, m[0].Receipt))
				require.ErrorIs(t, c.Release(ctx, m[0].Receipt), messages.ErrLeaseLost, "a receipt releases once")
			}
			require.Equal(t, 0, count(t, pool, dlq), "a release never dead-letters")
			require.Equal(t, 2, count(t, pool, q))
		})
	}
}

// TestWorkCleanStopDrains: when Work's ctx ends, a running handler keeps a live ctx,
// finishes and its message is acked; a handler still running at DrainTimeout sees its
// ctx cancelled and its message is released, its attempt not spent. Work used to
// cancel the handlers at once and nack their messages: at its last attempt (here the
// only one) a message was dead-lettered by a clean stop.
func TestWorkCleanStopDrains(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		finishes bool // the handler finishes during the drain
	}{{"handler finishes", true}, {"drain timeout", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			c := newClient(t, pool, nil)
			dlq := newQueue(t, pool, nil)
			q := newQueue(t, pool, &messages.QueueConfig{DeadLetterQueue: dlq, MaxDeliveryAttempts: 1})
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1)})
			require.NoError(t, err)
			wctx, stop := context.WithCancel(ctx)
			defer stop()
			started, finish := make(chan struct{}), make(chan struct{})
			var handlerErr error
			done := make(chan error, 1)
			go func() {
				done <- c.Work(wctx, q, &messages.WorkerConfig{Concurrency: 1, PollWait: 50 * time.Millisecond,
					DrainTimeout: 300 * time.Millisecond},
					func(hctx context.Context, m *messages.Message) error {
						close(started)
						select {
						case <-finish:
						case <-hctx.Done():
						}
						handlerErr = hctx.Err()
						return handlerErr
					})
			}()
			<-started
			stop()
			if tc.finishes {
				close(finish)
			}
			require.NoError(t, awaitWork(t, done, 10*time.Second, "after its ctx ended"))
			require.Equal(t, 0, count(t, pool, dlq), "a clean stop dead-lettered the message")
			if tc.finishes {
				require.NoError(t, handlerErr, "the handler's ctx stayed live during the drain")
				require.Equal(t, 0, count(t, pool, q), "acked")
				return
			}
			require.True(t, errors.Is(handlerErr, context.Canceled))
			m, err := c.Receive(ctx, q, nil)
			require.NoError(t, err)
			require.Len(t, m, 1, "released: visible again at once")
			require.Equal(t, 1, m[0].DeliveryAttempts, "the interrupted delivery did not count")
		})
	}
}

// TestWorkReleasesWhatItReceivedWhileStopping: messages that a receive returns after
// Work's ctx ended (a receive statement already sent runs to its end) are never handed
// to a handler: Work releases them, their attempt not spent. The receive is held here
// by the exclusive lock of its dead-letter queue, which it needs for an exhausted
// message it found first.
func TestWorkReleasesWhatItReceivedWhileStopping(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	dlq := newQueue(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{DeadLetterQueue: dlq, MaxDeliveryAttempts: 1})
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("poison"), MessageID: "poison"})
	require.NoError(t, err)
	m, err := c.Receive(ctx, q, &messages.ReceiveOpts{VisibilityTimeout: time.Millisecond})
	require.NoError(t, err)
	require.Len(t, m, 1) // its one attempt spent; the next receive dead-letters it
	_, err = c.Send(ctx, q, messages.OutgoingMessage{Data: data(1), MessageID: "a"}, messages.OutgoingMessage{Data: data(2), MessageID: "b"})
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock(1396986164, hashtext($1))", dlq) // queue_lock_shared's lock
	require.NoError(t, err)

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var handled atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- c.Work(wctx, q, &messages.WorkerConfig{Concurrency: 3, PollWait: 50 * time.Millisecond},
			func(context.Context, *messages.Message) error {
				handled.Add(1)
				return nil
			})
	}()
	testdb.WaitForLockWait(t, pool, tx, "queue_receive")
	stop()
	require.NoError(t, tx.Rollback(ctx)) // the receive goes on: poison dead-lettered, a and b leased
	require.NoError(t, awaitWork(t, done, 10*time.Second, "after its ctx ended"))

	require.Zero(t, handled.Load(), "a stopping Work handed messages to its handler")
	got, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
	require.NoError(t, err)
	require.Len(t, got, 2, "released: visible again at once")
	for _, m := range got {
		require.Equal(t, 1, m.DeliveryAttempts, "%s: the receive Work did not hand over counted an attempt", m.MessageID)
	}
	require.Equal(t, 1, count(t, pool, dlq), "only the exhausted message was dead-lettered")
}
