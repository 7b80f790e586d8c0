package messages_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// awaitWork returns Work's result, failing the test when it has not returned within d.
func awaitWork(t *testing.T, done <-chan error, d time.Duration, why string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("Work did not return within %v: %s", d, why)
		return nil
	}
}

// TestWorkStopsItsHandlersWhenItsQueueGoes guards the Handler contract ("ctx is
// cancelled ... when Work stops on an error, and when the message's lease is lost")
// when the queue is deleted under a running handler, both ways Work can learn it:
//   - a receive fails (a slot is free, so Work receives while the handler runs): the
//     running handlers' ctx is cancelled and Work returns the error; it used to wait
//     for handlers whose ctx nothing would cancel;
//   - only the lease extension can see it (the handler holds the only slot): a
//     deleted queue is a lost lease; it used to count as a transient failure, retried
//     forever.
func TestWorkStopsItsHandlersWhenItsQueueGoes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  messages.WorkerConfig
		wait time.Duration
		why  string
	}{
		{"receive error", messages.WorkerConfig{Concurrency: 2, PollWait: 50 * time.Millisecond},
			5 * time.Second, "the running handler's ctx was never cancelled"},
		{"lease extension", messages.WorkerConfig{Concurrency: 1, ExtendEvery: 50 * time.Millisecond, PollWait: 50 * time.Millisecond},
			10 * time.Second, "the extender took the deleted queue for a transient failure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			c := newClient(t, pool, nil)
			q := newQueue(t, pool, nil)
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1)})
			require.NoError(t, err)
			started := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				done <- c.Work(ctx, q, &tc.cfg, func(hctx context.Context, m *messages.Message) error {
					close(started)
					<-hctx.Done()
					return hctx.Err()
				})
			}()
			<-started
			require.NoError(t, c.DeleteQueue(ctx, q))
			err = awaitWork(t, done, tc.wait, tc.why)
			require.ErrorIs(t, err, messages.ErrQueueNotFound)
		})
	}
}

// TestWorkHandlerSelfAckIsNoLeaseLost guards streamd_queue_lease_lost_total against
// the pattern the Handler doc recommends: a handler that acks its message itself
// (AckTx in the transaction of its own writes) is no lost lease when Work's own ack
// then finds the receipt spent. It used to count one per message.
func TestWorkHandlerSelfAckIsNoLeaseLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	reg := prometheus.NewRegistry()
	c, err := messages.NewClient(pool, &messages.ClientConfig{Registerer: reg})
	require.NoError(t, err)
	q := newQueue(t, pool, nil)
	const n = 5
	for i := range n {
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(i)})
		require.NoError(t, err)
	}
	var handled atomic.Int32
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- c.Work(wctx, q, &messages.WorkerConfig{PollWait: 50 * time.Millisecond}, func(hctx context.Context, m *messages.Message) error {
			defer handled.Add(1)
			tx, err := pool.Begin(hctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(hctx) }()
			if err := c.AckTx(hctx, tx, m.Receipt); err != nil {
				return err
			}
			return tx.Commit(hctx)
		})
	}()
	require.Eventually(t, func() bool { return handled.Load() == n && count(t, pool, q) == 0 },
		20*time.Second, 10*time.Millisecond)
	stop()
	require.NoError(t, awaitWork(t, done, 10*time.Second, "after its ctx ended"))
	require.Equal(t, float64(n), queueCounter(t, reg, "streamd_queue_acked_messages_total", q))
	require.Zero(t, queueCounter(t, reg, "streamd_queue_lease_lost_total", q))
}

// TestWorkNegativeBackoffNacksAtOnce guards WorkerConfig.Backoff: a schedule that
// returns a negative delay counts as 0, so the failed message is nacked and retried
// at once. The nack used to be refused (ErrInvalidArgument), which left the message
// leased until its visibility timeout.
func TestWorkNegativeBackoffNacksAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{MaxDeliveryAttempts: 10})
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1)})
	require.NoError(t, err)
	var attempts atomic.Int32
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- c.Work(wctx, q, &messages.WorkerConfig{
			Backoff:           func(int) time.Duration { return -time.Second },
			PollWait:          50 * time.Millisecond,
			VisibilityTimeout: time.Hour,
		}, func(_ context.Context, m *messages.Message) error {
			if attempts.Add(1) == 1 {
				return errors.New("first attempt fails") // nacked with the backoff
			}
			return nil
		})
	}()
	require.Eventually(t, func() bool { return attempts.Load() == 2 && count(t, pool, q) == 0 },
		10*time.Second, 10*time.Millisecond, "retried at once, not after the 1h lease")
	stop()
	require.NoError(t, awaitWork(t, done, 10*time.Second, "after its ctx ended"))
}

// TestWorkKeepsTheLeaseOfARolledBackSelfAck (Q1): a handler whose own AckTx is rolled
// back still holds its message: Work keeps extending the lease while the handler
// runs, so no other consumer receives it meanwhile. Work used to stop extending as soon
// as the handler's ack statement ran, before its transaction's outcome.
func TestWorkKeepsTheLeaseOfARolledBackSelfAck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	other := newClient(t, pool, nil)
	q := newQueue(t, pool, nil)
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1)})
	require.NoError(t, err)
	stolen := make(chan []*messages.Message, 1)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	var once sync.Once
	go func() {
		// A lease of a second, extended every 50 ms: a loaded machine (make test runs
		// packages side by side) delayed extensions of a 300 ms lease past its end.
		done <- c.Work(wctx, q, &messages.WorkerConfig{Concurrency: 1, VisibilityTimeout: time.Second,
			ExtendEvery: 50 * time.Millisecond, PollWait: 50 * time.Millisecond},
			func(hctx context.Context, m *messages.Message) error {
				tx, err := pool.Begin(hctx)
				if err != nil {
					return err
				}
				if err := c.AckTx(hctx, tx, m.Receipt); err != nil {
					return err
				}
				if err := tx.Rollback(hctx); err != nil { // the handler's writes failed
					return err
				}
				// Three lease lengths: another consumer waits for the message.
				got, err := other.Receive(hctx, q, &messages.ReceiveOpts{Wait: 3 * time.Second})
				if err != nil && !errors.Is(err, context.Canceled) {
					return err
				}
				once.Do(func() { stolen <- got })
				return nil
			})
	}()
	select {
	case got := <-stolen:
		require.Empty(t, got, "another consumer received the message while its handler still ran")
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not finish")
	}
	stop()
	require.NoError(t, awaitWork(t, done, 10*time.Second, "after its ctx ended"))
}

// TestWorkSettlesWhateverItsHandlerErrorSays: a handler's error is recorded as the
// message's last error, and its text is the handler's, not the database's: one that
// holds a NUL byte or invalid UTF-8 (raw bytes of a bad payload, say) made Work's
// Term and Nack fail on PostgreSQL's text (22021), so the message was neither
// dead-lettered nor given back, and came back only when its lease ran out. A Nack or
// Term called with such text is refused with ErrInvalidArgument, nothing settled.
func TestWorkSettlesWhateverItsHandlerErrorSays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	dlq := newQueue(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{DeadLetterQueue: dlq, VisibilityTimeout: time.Minute})
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("term")}, messages.OutgoingMessage{Data: data("nack")})
	require.NoError(t, err)

	m, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 2})
	require.NoError(t, err)
	require.Len(t, m, 2)
	require.ErrorIs(t, c.Nack(ctx, &messages.NackOpts{Error: "bad \x00 byte"}, m[1].Receipt), messages.ErrInvalidArgument)
	require.ErrorIs(t, c.Term(ctx, "bad \xff byte", m[0].Receipt), messages.ErrInvalidArgument)
	require.NoError(t, c.Release(ctx, m[0].Receipt, m[1].Receipt), "nothing was settled")

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	nacked := make(chan struct{})
	var once sync.Once
	go func() {
		done <- c.Work(wctx, q, &messages.WorkerConfig{PollWait: 50 * time.Millisecond,
			Backoff: func(int) time.Duration { return time.Hour }},
			func(_ context.Context, m *messages.Message) error {
				if string(m.Data) == `"term"` {
					return messages.TermError(errors.New("bad \x00 byte"))
				}
				once.Do(func() { close(nacked) })
				return errors.New("bad \xff byte")
			})
	}()
	testdb.WaitFor(t, 10*time.Second, "the termed message in the dead-letter queue", func() bool {
		dead, err := c.Peek(ctx, dlq, nil)
		require.NoError(t, err)
		return len(dead) == 1
	})
	<-nacked
	testdb.WaitFor(t, 10*time.Second, "the nacked message's last error", func() bool {
		held, err := c.Peek(ctx, q, nil)
		require.NoError(t, err)
		return len(held) == 1 && held[0].LastError != ""
	})
	stop()
	require.NoError(t, awaitWork(t, done, 10*time.Second, "stop"))
	dead, err := c.Peek(ctx, dlq, nil)
	require.NoError(t, err)
	require.Equal(t, "bad \uFFFD byte", dead[0].LastError)
	held, err := c.Peek(ctx, q, nil)
	require.NoError(t, err)
	require.Equal(t, "bad \uFFFD byte", held[0].LastError)
}
