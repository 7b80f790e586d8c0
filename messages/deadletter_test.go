package messages_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/internal/testmetrics"
	"github.com/streamd/streamd/messages"
)

// setupDLQ returns a client on a fake clock, a queue with maxAttempts and a 10s lease,
// and its dead-letter queue.
func setupDLQ(t *testing.T, clock *fakeClock, maxAttempts int) (*messages.Client, string, string) {
	t.Helper()
	pool := testdb.Pool(t)
	dlq := newQueue(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{DeadLetterQueue: dlq, MaxDeliveryAttempts: maxAttempts, VisibilityTimeout: 10 * time.Second})
	return newClient(t, pool, clock), q, dlq
}

// Q2: a message whose leases keep expiring moves to the dead-letter queue at the
// receive after its last attempt, once, with its provenance.
func TestDeadLetterAfterMaxAttemptsOnExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q, dlq := setupDLQ(t, clock, 2)
	sent, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("p"), MessageID: "poison", Headers: map[string]string{"k": "v"}})
	require.NoError(t, err)
	for attempt := 1; attempt <= 2; attempt++ {
		m, err := c.Receive(ctx, q, nil)
		require.NoError(t, err)
		require.Len(t, m, 1)
		require.Equal(t, attempt, m[0].DeliveryAttempts)
		clock.Advance(11 * time.Second)
	}
	m, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Empty(t, m, "the third receive dead-letters instead of delivering")
	require.Equal(t, 0, count(t, c.Pool(), q))
	require.Equal(t, 1, count(t, c.Pool(), dlq))

	dead, err := c.Receive(ctx, dlq, nil)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "poison", dead[0].MessageID)
	require.JSONEq(t, `"p"`, string(dead[0].Data))
	require.Equal(t, map[string]string{"k": "v"}, dead[0].Headers)
	require.NotNil(t, dead[0].Origin)
	require.Equal(t, q, dead[0].Origin.Queue)
	require.Equal(t, sent[0].Offset, dead[0].Origin.Offset)
	require.Equal(t, 2, dead[0].Origin.Attempts)
	require.Equal(t, 1, dead[0].DeliveryAttempts, "attempts start over in the dead-letter queue")

	st, err := c.Stats(ctx, q)
	require.NoError(t, err)
	require.Equal(t, int64(1), st[0].DeadLettered)
	require.Equal(t, int64(0), st[0].Total)
}

// A nack of the last attempt dead-letters at once, keeping the error; Term
// dead-letters at any attempt with its reason; Term without a dead-letter queue
// discards.
func TestNackExhaustedAndTerm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q, dlq := setupDLQ(t, clock, 1)
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1), MessageID: "a"}, messages.OutgoingMessage{Data: data(2), MessageID: "b"})
	require.NoError(t, err)
	m, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 2})
	require.NoError(t, err)
	require.Len(t, m, 2)
	require.NoError(t, c.Nack(ctx, &messages.NackOpts{Error: "decode failed"}, m[0].Receipt))
	require.NoError(t, c.Term(ctx, "bad customer", m[1].Receipt))
	require.ErrorIs(t, c.Ack(ctx, m[1].Receipt), messages.ErrLeaseLost)

	dead, err := c.Peek(ctx, dlq, nil)
	require.NoError(t, err)
	require.Len(t, dead, 2)
	require.Equal(t, "a", dead[0].MessageID)
	require.Equal(t, "decode failed", dead[0].LastError)
	require.Equal(t, "b", dead[1].MessageID)
	require.Equal(t, "bad customer", dead[1].LastError)
	require.Equal(t, 0, count(t, c.Pool(), q))

	// Without a dead-letter queue: retried past any count, and Term discards.
	plain := newQueue(t, c.Pool(), &messages.QueueConfig{MaxDeliveryAttempts: 1})
	_, err = c.Send(ctx, plain, messages.OutgoingMessage{Data: data(1)})
	require.NoError(t, err)
	for range 3 {
		m, err = c.Receive(ctx, plain, nil)
		require.NoError(t, err)
		require.Len(t, m, 1)
		require.NoError(t, c.Nack(ctx, nil, m[0].Receipt))
	}
	m, err = c.Receive(ctx, plain, nil)
	require.NoError(t, err)
	require.NoError(t, c.Term(ctx, "give up", m[0].Receipt))
	require.Equal(t, 0, count(t, c.Pool(), plain))
}

// Redrive moves dead letters back to their origin in dead-letter order, with fresh
// attempts; a message id the origin holds again does not collide.
func TestRedrive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, q, dlq := setupDLQ(t, nil, 1)
	var ids []string
	for i := range 5 {
		id := string(rune('a' + i))
		ids = append(ids, id)
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(i), MessageID: id})
		require.NoError(t, err)
		m, err := c.Receive(ctx, q, nil)
		require.NoError(t, err)
		require.NoError(t, c.Term(ctx, "x", m[0].Receipt))
	}
	// The origin holds "a" again.
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("new"), MessageID: "a"})
	require.NoError(t, err)

	n, err := c.Redrive(ctx, dlq, &messages.RedriveOpts{BatchSize: 2, Rate: 1000})
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.Equal(t, 0, count(t, c.Pool(), dlq))
	got, err := c.Peek(ctx, q, nil)
	require.NoError(t, err)
	require.Len(t, got, 6)
	require.Equal(t, "a", got[0].MessageID)
	require.JSONEq(t, `"new"`, string(got[0].Data))
	for i, m := range got[1:] {
		require.JSONEq(t, string(data(i)), string(m.Data), "in dead-letter order")
		require.Equal(t, 0, m.DeliveryAttempts)
		require.Nil(t, m.Origin)
		require.Equal(t, "x", m.LastError)
	}
	require.NotEqual(t, "a", got[1].MessageID, "the collision got a suffix")
	require.Contains(t, got[1].MessageID, "a~")
}

// Two dead letters with the same named id in one dead-letter queue: the second gets
// a suffix (the dedup index would refuse it); made ids need none.
func TestDeadLetterIdCollision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, q, dlq := setupDLQ(t, nil, 1)
	for i := range 2 {
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(i), MessageID: "same"}, messages.OutgoingMessage{Data: data(i)})
		require.NoError(t, err)
		m, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
		require.NoError(t, err)
		require.Len(t, m, 2)
		require.NoError(t, c.Term(ctx, "x", m[0].Receipt, m[1].Receipt))
	}
	got, err := c.Peek(ctx, dlq, nil)
	require.NoError(t, err)
	require.Len(t, got, 4)
	require.Equal(t, "same", got[0].MessageID)
	require.Contains(t, got[2].MessageID, "same@"+q+":")
	require.NotContains(t, got[1].MessageID, "@")
	require.NotContains(t, got[3].MessageID, "@")
}

func TestStatsAndPurge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q, _ := setupDLQ(t, clock, 3)
	_, err := c.Send(ctx, q,
		messages.OutgoingMessage{Data: data(1)}, messages.OutgoingMessage{Data: data(2)},
		messages.OutgoingMessage{Data: data(3), Delay: time.Minute})
	require.NoError(t, err)
	_, err = c.Receive(ctx, q, nil)
	require.NoError(t, err)
	clock.Advance(2 * time.Second)
	st, err := c.Stats(ctx, q)
	require.NoError(t, err)
	require.Len(t, st, 1)
	require.Equal(t, messages.QueueStats{Queue: q, DeadLetterQueue: st[0].DeadLetterQueue, Depth: 1, InFlight: 1, Delayed: 1, Total: 3,
		OldestAge: 2 * time.Second}, st[0])

	n, err := c.Purge(ctx, q)
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	require.Equal(t, 0, count(t, c.Pool(), q))
	_, err = c.Stats(ctx, testdb.Name("missing"))
	require.ErrorIs(t, err, messages.ErrQueueNotFound)
	_, err = c.Purge(ctx, testdb.Name("missing"))
	require.ErrorIs(t, err, messages.ErrQueueNotFound)
	require.ErrorIs(t, c.DeleteQueue(ctx, st[0].DeadLetterQueue), messages.ErrQueueInUse)
	require.NoError(t, c.DeleteQueue(ctx, q))
	require.NoError(t, c.DeleteQueue(ctx, st[0].DeadLetterQueue))
}

// The queue functions read a queue through its range of the primary key, never by
// scanning the whole table: migration 0008 tells the planner a queue is the whole
// table, and queue_stats once scanned it once per queue (62 s for 1,014 queues).
// pg_stat_xact_user_tables counts the sequential scans of the current transaction.
func TestQueueFunctionsDoNotScanTheTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, q, dlq := setupDLQ(t, nil, 1)
	for i := range 3 {
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(i)})
		require.NoError(t, err)
	}
	m, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.NoError(t, c.Term(ctx, "x", m[0].Receipt))

	for _, st := range []struct {
		sql  string
		args []any
	}{
		// Every column: a count(*) lets the planner drop the per-queue subqueries.
		{`SELECT queue_name, depth, in_flight, delayed, total, dead_lettered, oldest_enqueued_at
			FROM streamd.queue_stats(NULL, NULL)`, nil},
		{`SELECT queue_name, depth, in_flight, delayed, total, dead_lettered, oldest_enqueued_at
			FROM streamd.queue_stats($1, NULL)`, []any{q}},
		{`SELECT streamd.queue_redrive($1, 10, NULL)`, []any{dlq}},
		{`SELECT streamd.queue_purge($1)`, []any{q}},
		{`SELECT * FROM streamd.queue_release($1, ARRAY[0]::bigint[], ARRAY[gen_random_uuid()], NULL)`, []any{q}},
	} {
		func() {
			tx, err := c.Pool().Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, st.sql, st.args...)
			require.NoError(t, err, st.sql)
			var seq int64
			require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(seq_scan, 0) FROM pg_stat_xact_user_tables
				WHERE relid = 'streamd.queue_messages'::regclass`).Scan(&seq))
			require.Zero(t, seq, "%s scanned streamd.queue_messages", st.sql)
		}()
	}
}

// TestWorkerNilWrappedErrors: a handler that returns RetryAfter(nil, d) or
// TermError(nil) gets a nack and a dead letter (with "terminated" as the reason), not
// a nil-pointer panic that kills the process.
func TestWorkerNilWrappedErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	dlq := newQueue(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{DeadLetterQueue: dlq, MaxDeliveryAttempts: 10})
	c := newClient(t, pool, nil)
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("retry")}, messages.OutgoingMessage{Data: data("term")})
	require.NoError(t, err)

	var mu sync.Mutex
	retried := 0
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- c.Work(wctx, q, &messages.WorkerConfig{PollWait: 50 * time.Millisecond}, func(_ context.Context, m *messages.Message) error {
			if string(m.Data) == `"term"` {
				return messages.TermError(nil)
			}
			mu.Lock()
			defer mu.Unlock()
			if retried++; retried == 1 {
				return messages.RetryAfter(nil, 0)
			}
			return nil
		})
	}()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return retried == 2 && count(t, pool, q) == 0 && count(t, pool, dlq) == 1
	}, 30*time.Second, 20*time.Millisecond, "retried once then acked; termed into the dead-letter queue")
	stop()
	require.NoError(t, <-done)
	dead, err := c.Peek(ctx, dlq, nil)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "terminated", dead[0].LastError)

	// ExtendEvery must be shorter than the lease Work takes, its default included.
	err = c.Work(ctx, q, &messages.WorkerConfig{ExtendEvery: 45 * time.Second}, func(context.Context, *messages.Message) error { return nil })
	require.ErrorIs(t, err, messages.ErrInvalidArgument)
	require.ErrorContains(t, err, "VisibilityTimeout 30s")
	// A max delivery attempts past int32 is refused, not truncated.
	_, err = c.Send(ctx, q, messages.OutgoingMessage{Data: data(1), MaxDeliveryAttempts: 1<<32 + 1})
	require.ErrorIs(t, err, messages.ErrInvalidArgument)
	require.Zero(t, count(t, pool, q), "nothing written")
	require.ErrorIs(t, c.CreateQueue(ctx, q+"-big", &messages.QueueConfig{MaxDeliveryAttempts: 1 << 32}), messages.ErrInvalidArgument)
}

// TestDeadLetterQueueGoneMeanwhile: a message keeps the dead-letter queue it was sent
// with; when that queue has been deleted since, the message is not moved into a queue
// that is not there (it was, and was lost): it is retried past its attempts like a
// message without one, and Term deletes it.
func TestDeadLetterQueueGoneMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, q, dlq := setupDLQ(t, nil, 1)
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1)})
	require.NoError(t, err)
	require.NoError(t, c.CreateQueue(ctx, q, &messages.QueueConfig{MaxDeliveryAttempts: 1, VisibilityTimeout: 10 * time.Second}))
	require.NoError(t, c.DeleteQueue(ctx, dlq), "no queue's settings name it any more")

	for attempt := 1; attempt <= 3; attempt++ {
		m, err := c.Receive(ctx, q, nil)
		require.NoError(t, err)
		require.Len(t, m, 1, "attempt %d: still in its queue", attempt)
		require.Equal(t, attempt, m[0].DeliveryAttempts)
		require.NoError(t, c.Nack(ctx, nil, m[0].Receipt))
	}
	m, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.NoError(t, c.Term(ctx, "give up", m[0].Receipt))
	require.Zero(t, count(t, c.Pool(), q))
	require.Zero(t, count(t, c.Pool(), dlq), "nothing landed in the deleted queue")
}

// TestDeadLetterAndRedriveKeepTheTenant: a message's tenant_id moves with it to the
// dead-letter queue and back (row-level security keys on it); it used to take the
// tenant setting of whoever's session did the move (none for a worker or an admin).
func TestDeadLetterAndRedriveKeepTheTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, q, dlq := setupDLQ(t, nil, 1)
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1)})
	require.NoError(t, err)
	_, err = c.Pool().Exec(ctx, "UPDATE streamd.messages SET tenant_id = 'acme' WHERE stream_name = $1", q)
	require.NoError(t, err)
	tenantOf := func(queue string) *string {
		var tn *string
		require.NoError(t, c.Pool().QueryRow(ctx, "SELECT tenant_id FROM streamd.messages WHERE stream_name = $1", queue).Scan(&tn))
		return tn
	}
	m, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.NoError(t, c.Term(ctx, "x", m[0].Receipt))
	require.Equal(t, "acme", *tenantOf(dlq))
	var recordTenant *string
	require.NoError(t, c.Pool().QueryRow(ctx, "SELECT tenant_id FROM streamd.queue_dead_letters WHERE dead_letter_queue = $1",
		dlq).Scan(&recordTenant))
	require.NotNil(t, recordTenant, "the dead letter's record is its message's tenant's")
	require.Equal(t, "acme", *recordTenant)
	n, err := c.Redrive(ctx, dlq, nil)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "acme", *tenantOf(q))
}

// TestDeleteQueueWaitsForSends: a queue's deletion waits for a send still in its
// transaction (SendTx) and then deletes its messages too; it used to go ahead, and
// the send's rows were left, committed, in a queue that no longer existed.
func TestDeleteQueueWaitsForSends(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	q := newQueue(t, pool, nil)
	c := newClient(t, pool, nil)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = c.SendTx(ctx, tx, q, messages.OutgoingMessage{Data: data(1)})
	require.NoError(t, err)

	deleted := make(chan error, 1)
	go func() { deleted <- c.DeleteQueue(ctx, q) }()
	select {
	case err := <-deleted:
		t.Fatalf("DeleteQueue returned (%v) while a send to the queue was uncommitted", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-deleted)
	require.Zero(t, count(t, pool, q), "the send's message went with its queue")
}

// TestSendWaitingForADeleteStoresNothing: a send that waits for a deletion of its
// queue finds no queue once the deletion commits (ErrQueueNotFound) and leaves no
// message behind, through the client's direct INSERT (sendDirectSQL) as through
// queue_send: the queue's row is read after its lock, not with the snapshot of the
// statement's start.
func TestSendWaitingForADeleteStoresNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	for _, named := range []bool{false, true} { // the direct INSERT; queue_send (a named id)
		q := newQueue(t, pool, nil)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.Background()) }()
		_, err = tx.Exec(ctx, "SELECT streamd.queue_delete($1)", q)
		require.NoError(t, err)
		msg := messages.OutgoingMessage{Data: data(1)}
		if named {
			msg.MessageID = "named"
		}
		sent := make(chan error, 1)
		go func() { _, err := c.Send(ctx, q, msg); sent <- err }()
		testdb.WaitForLockWait(t, pool, tx, "queue_send") // queue_send_target or queue_send
		require.NoError(t, tx.Commit(ctx))
		require.ErrorIs(t, <-sent, messages.ErrQueueNotFound, "named id %v", named)
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.queue_messages WHERE stream_name = $1", q).Scan(&n))
		require.Zero(t, n, "named id %v: a message of a deleted queue", named)
	}
}

// TestNackAppliesTheCurrentReceipt: one Nack naming a message by a stale receipt and
// by its current one applies the current receipt's delay (the stale one's is ignored)
// and reports the stale one as lost.
func TestNackAppliesTheCurrentReceipt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q := setup(t, clock, &messages.QueueConfig{VisibilityTimeout: time.Second, MaxDeliveryAttempts: 10})
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1)})
	require.NoError(t, err)
	first, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	clock.Advance(2 * time.Second) // the first lease expires
	second, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Len(t, second, 1)
	// Attempt 1 (stale) would wait an hour, attempt 2 (current) not at all.
	sched := func(attempt int) time.Duration {
		if attempt == 1 {
			return time.Hour
		}
		return 0
	}
	err = c.Nack(ctx, &messages.NackOpts{Backoff: sched}, first[0].Receipt, second[0].Receipt)
	require.ErrorIs(t, err, messages.ErrLeaseLost)
	again, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Len(t, again, 1, "visible at once: the current receipt's delay")
}

// TestRedriveEndsWithPoison: Redrive without a limit moves the dead letters there when
// it started, and returns, even while a poison message keeps failing and coming back
// (it used to chase it until its ctx ended).
func TestRedriveEndsWithPoison(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, q, dlq := setupDLQ(t, nil, 1)
	for i := range 3 {
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(i)})
		require.NoError(t, err)
		m, err := c.Receive(ctx, q, nil)
		require.NoError(t, err)
		require.NoError(t, c.Term(ctx, "poison", m[0].Receipt))
	}
	// A worker that fails every message at once: each redriven message comes back.
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Work(wctx, q, &messages.WorkerConfig{PollWait: 20 * time.Millisecond},
			func(context.Context, *messages.Message) error { return messages.TermError(nil) })
	}()
	n, err := c.Redrive(ctx, dlq, &messages.RedriveOpts{BatchSize: 1, Rate: 20})
	require.NoError(t, err, "Redrive returned")
	require.Equal(t, 3, n)
	stop()
	require.NoError(t, <-done)
	_, err = c.Redrive(ctx, "no-such-"+dlq, nil)
	require.ErrorIs(t, err, messages.ErrQueueNotFound)
}

// TestDeadLetterRacesASendOfTheSameID: a message dead-lettered while a send of the
// same message id to the dead-letter queue is still uncommitted waits for that send
// and then lands under the suffixed id; its move used to fail on the dedup index
// (23505), which stopped Work.
func TestDeadLetterRacesASendOfTheSameID(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, q, dlq := setupDLQ(t, nil, 5)
	pool := c.Pool()
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("a"), MessageID: "same-id"})
	require.NoError(t, err)
	m, err := c.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Len(t, m, 1)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = c.SendTx(ctx, tx, dlq, messages.OutgoingMessage{Data: data("b"), MessageID: "same-id"})
	require.NoError(t, err)

	termed := make(chan error, 1)
	go func() { termed <- c.Term(ctx, "bad", m[0].Receipt) }()
	// Commit the send only once the move waits for it on the dedup index.
	testdb.WaitForLockWait(t, pool, tx, "queue_term")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-termed)

	dead, err := c.Peek(ctx, dlq, nil)
	require.NoError(t, err)
	require.Len(t, dead, 2)
	ids := []string{dead[0].MessageID, dead[1].MessageID}
	require.Contains(t, ids, "same-id")
	require.Contains(t, ids, fmt.Sprintf("same-id@%s:%d", q, m[0].Offset))
}

// TestWorkStopsWithEveryConnectionBusy: Work returns soon after its ctx ends even when
// its receive is waiting for a pool connection (it used to wait out the receive's
// 30-second statement bound).
func TestWorkStopsWithEveryConnectionBusy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := testdb.Config(t)
	cfg.MaxConns = 1
	acquiring := &acquireSignal{started: make(chan struct{})}
	cfg.ConnConfig.Tracer = acquiring
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	q := newQueue(t, pool, nil)
	c := newClient(t, pool, nil)
	held, err := pool.Acquire(ctx) // the only connection
	require.NoError(t, err)
	defer held.Release()
	acquiring.armed.Store(true)

	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Work(wctx, q, &messages.WorkerConfig{PollWait: 50 * time.Millisecond},
			func(context.Context, *messages.Message) error { return nil })
	}()
	// Stop once Work asks the pool for a connection (its receive's: Work takes none
	// before), not after a sleep: a stop that came first let Work return from its
	// loop, and the test passed whatever the receive did.
	select {
	case <-acquiring.started:
	case <-time.After(10 * time.Second):
		t.Fatal("Work did not ask for a connection within 10s")
	}
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Work did not return within 10s of its ctx ending")
	}
}

// acquireSignal is a pool tracer that closes started when an Acquire begins once
// armed (pgxpool.AcquireTracer; the query hooks do nothing).
type acquireSignal struct {
	armed   atomic.Bool
	once    sync.Once
	started chan struct{}
}

func (a *acquireSignal) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	if a.armed.Load() {
		a.once.Do(func() { close(a.started) })
	}
	return ctx
}

func (a *acquireSignal) TraceAcquireEnd(context.Context, *pgxpool.Pool, pgxpool.TraceAcquireEndData) {
}

func (a *acquireSignal) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (a *acquireSignal) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestDuplicateReceiptSettlesOnce guards Q2 against a receipt named twice in one Nack
// or Term: the message moves to the dead-letter queue once (it moved once per
// naming, and with a named message id the second copy failed on the dedup index),
// and the metrics count it once (Nack's nacked count went negative and the counter
// panicked after the transaction had committed).
func TestDuplicateReceiptSettlesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	reg := prometheus.NewRegistry()
	c, err := messages.NewClient(pool, &messages.ClientConfig{Registerer: reg})
	require.NoError(t, err)
	dlq := newQueue(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{DeadLetterQueue: dlq, MaxDeliveryAttempts: 1})
	_, err = c.Send(ctx, q,
		messages.OutgoingMessage{Data: data("term")},
		messages.OutgoingMessage{Data: data("nack")},
		messages.OutgoingMessage{Data: data("named"), MessageID: "named"},
		messages.OutgoingMessage{Data: data("retry"), MaxDeliveryAttempts: 5})
	require.NoError(t, err)
	m, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 4})
	require.NoError(t, err)
	require.Len(t, m, 4)

	require.NoError(t, c.Term(ctx, "bad", m[0].Receipt, m[0].Receipt))
	require.NotPanics(t, func() { require.NoError(t, c.Nack(ctx, nil, m[1].Receipt, m[1].Receipt)) })
	require.NoError(t, c.Term(ctx, "bad", m[2].Receipt, m[2].Receipt))
	require.NoError(t, c.Nack(ctx, &messages.NackOpts{Error: "again"}, m[3].Receipt, m[3].Receipt))
	require.Equal(t, map[string]int{`"term"`: 1, `"nack"`: 1, `"named"`: 1}, deadLetterData(t, pool, dlq))
	require.Equal(t, 1, count(t, pool, q), "the message with attempts left went back")
	require.Equal(t, 3.0, queueCounter(t, reg, "streamd_queue_dead_lettered_messages_total", q))
	require.Equal(t, 1.0, queueCounter(t, reg, "streamd_queue_nacked_messages_total", q))
	require.Zero(t, queueCounter(t, reg, "streamd_queue_lease_lost_total", q))
}

// TestDuplicateReceiptSettlesOnceInSQL guards Q2 in the SQL functions themselves
// (plain SQL is a way to consume): queue_nack and queue_term named one receipt twice
// moved the message to the dead-letter queue twice.
func TestDuplicateReceiptSettlesOnceInSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, q, dlq := setupDLQ(t, nil, 1)
	pool := c.Pool()
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("nack")}, messages.OutgoingMessage{Data: data("term")},
		messages.OutgoingMessage{Data: data("named"), MessageID: "named"})
	require.NoError(t, err)
	m, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 3})
	require.NoError(t, err)
	require.Len(t, m, 3)
	settled := func(sql string, r messages.Receipt) int {
		t.Helper()
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql, q, []int64{r.Offset, r.Offset}, [][16]byte{r.LeaseToken, r.LeaseToken}).Scan(&n))
		return n
	}
	require.Equal(t, 1, settled(`SELECT count(*) FROM streamd.queue_nack($1, $2, $3, ARRAY[0, 0]::bigint[], ARRAY['a', 'b'], NULL)`, m[0].Receipt))
	require.Equal(t, 1, settled(`SELECT count(*) FROM streamd.queue_term($1, $2, $3, ARRAY['a', 'b'], NULL)`, m[1].Receipt))
	require.Equal(t, 1, settled(`SELECT count(*) FROM streamd.queue_term($1, $2, $3, ARRAY['a', 'b'], NULL)`, m[2].Receipt))
	require.Equal(t, map[string]int{`"nack"`: 1, `"term"`: 1, `"named"`: 1}, deadLetterData(t, pool, dlq))
	dead, err := c.Peek(ctx, dlq, nil)
	require.NoError(t, err)
	for _, d := range dead {
		require.Equal(t, "a", d.LastError, "the first naming's error")
	}
}

// deadLetterData returns how many times each payload (as JSON text) sits in dlq.
func deadLetterData(t *testing.T, pool *pgxpool.Pool, dlq string) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		"SELECT data::text, count(*)::int FROM streamd.messages WHERE stream_name = $1 GROUP BY 1", dlq)
	require.NoError(t, err)
	out := map[string]int{}
	var d string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&d, &n}, func() error { out[d] = n; return nil })
	require.NoError(t, err)
	return out
}

// queueCounter is the value of counter name for queue in reg (0 before its first
// increment: the series does not exist yet).
func queueCounter(t *testing.T, reg *prometheus.Registry, name, queue string) float64 {
	t.Helper()
	v, _ := testmetrics.Lookup(t, reg, name, "queue", queue)
	return v
}

// TestSendOnlyRoleSends: a role granted INSERT on the queue's storage but no SELECT
// (a send-only producer, docs/tenants.md "Any other role") can call queue_send, so
// the client's common send (one statement, not queue_send) must work for it too. It
// failed with 42501 while that statement read its offsets back with RETURNING, which
// needs SELECT.
func TestSendOnlyRoleSends(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	q := newQueue(t, pool, nil)
	role := strings.ReplaceAll(testdb.Name("streamd_sendonly"), "-", "_")
	ident := pgx.Identifier{role}.Sanitize()
	_, err := pool.Exec(ctx, "CREATE ROLE "+ident+" LOGIN NOSUPERUSER NOBYPASSRLS")
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), testdb.URL(t))
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_ = pgx.BeginFunc(context.Background(), c, func(tx pgx.Tx) error {
			// Revoking changes the catalog rows other tests' GRANTs change: take the
			// lock streamd.bind_tenant_role takes.
			_, _ = tx.Exec(context.Background(), "SELECT pg_advisory_xact_lock(hashtext('streamd.tenant_roles'))")
			_, _ = tx.Exec(context.Background(), "DROP OWNED BY "+ident)
			_, err := tx.Exec(context.Background(), "DROP ROLE IF EXISTS "+ident)
			return err
		})
	})
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('streamd.tenant_roles'))")
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "GRANT USAGE ON SCHEMA streamd TO "+ident+
			"; GRANT SELECT ON streamd.queues TO "+ident+
			"; GRANT INSERT ON streamd.queue_messages TO "+ident+
			"; GRANT USAGE ON ALL SEQUENCES IN SCHEMA streamd TO "+ident)
		return err
	})
	require.NoError(t, err)

	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	cfg.ConnConfig.Password = ""
	rolePool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(rolePool.Close)

	c := newClient(t, rolePool, nil)
	var canSelect bool
	require.NoError(t, rolePool.QueryRow(ctx, "SELECT has_table_privilege('streamd.queue_messages', 'SELECT')").Scan(&canSelect))
	require.False(t, canSelect, "the role must not read the queue's storage")
	res, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(1)}, messages.OutgoingMessage{Data: data(2)})
	require.NoError(t, err)
	require.Len(t, res, 2)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.queue_messages WHERE stream_name = $1 AND (\"offset\", message_id) IN (($2, $3), ($4, $5))",
		q, res[0].Offset, res[0].MessageID, res[1].Offset, res[1].MessageID).Scan(&n))
	require.Equal(t, 2, n, "each result names its stored message")
	require.Less(t, res[0].Offset, res[1].Offset, "offsets in batch order")
}
