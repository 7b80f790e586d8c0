package messages_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// waitEmpty polls until queue holds no message, failing the test at the deadline.
func waitEmpty(t *testing.T, pool *pgxpool.Pool, queue string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for count(t, pool, queue) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("queue %s still holds %d messages after %v", queue, count(t, pool, queue), timeout)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, not waiting for one
	}
}

// deadLetters returns how many times each message id sits in dlq.
func deadLetters(t *testing.T, pool *pgxpool.Pool, dlq string) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT message_id FROM streamd.messages WHERE stream_name = $1", dlq)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		out[id]++
	}
	require.NoError(t, rows.Err())
	return out
}

// Q1 and Q2 under concurrency: Work loops (with lease extension, some handlers
// outliving the visibility timeout, poison messages nacked until they exhaust their
// attempts) race raw receivers that stall past their lease before acking or never
// ack poison. At the end every message was acked exactly once or dead-lettered
// exactly once, never both, and none is lost.
func TestConcurrentWorkersAckOrDeadLetterExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	dlq := newQueue(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{DeadLetterQueue: dlq, MaxDeliveryAttempts: 3, VisibilityTimeout: 150 * time.Millisecond})
	c := newClient(t, pool, nil)

	const n = 400
	poison := func(id string) bool { var i int; fmt.Sscanf(id, "m-%d", &i); return i%10 == 0 }
	for b := 0; b < n; b += 100 {
		var batch []messages.OutgoingMessage
		for i := b; i < b+100; i++ {
			batch = append(batch, messages.OutgoingMessage{Data: data(i), MessageID: fmt.Sprintf("m-%04d", i)})
		}
		_, err := c.Send(ctx, q, batch...)
		require.NoError(t, err)
	}

	var mu sync.Mutex
	acked := map[string]int{}
	var lostAcks, longHandlers atomic.Int64
	ack := func(r messages.Receipt) {
		err := c.Ack(context.WithoutCancel(ctx), r)
		if errors.Is(err, messages.ErrLeaseLost) {
			lostAcks.Add(1)
			return
		}
		require.NoError(t, err)
		mu.Lock()
		acked[r.MessageID]++
		mu.Unlock()
	}

	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(1, uint64(w)))
			var rmu sync.Mutex
			err := c.Work(wctx, q, &messages.WorkerConfig{
				Concurrency: 6, VisibilityTimeout: 150 * time.Millisecond, ExtendEvery: 40 * time.Millisecond,
				PollWait: 100 * time.Millisecond, Backoff: func(int) time.Duration { return 0 },
			}, func(ctx context.Context, m *messages.Message) error {
				if poison(m.MessageID) {
					return errors.New("poison")
				}
				rmu.Lock()
				long := rng.IntN(10) == 0
				rmu.Unlock()
				if long {
					// Outlive the visibility timeout: extension must keep the lease.
					longHandlers.Add(1)
					select {
					case <-time.After(300 * time.Millisecond):
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				ack(m.Receipt)
				return nil
			})
			require.NoError(t, err)
		}()
	}
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(2, uint64(r)))
			for wctx.Err() == nil {
				msgs, err := c.Receive(wctx, q, &messages.ReceiveOpts{Max: 5, VisibilityTimeout: 100 * time.Millisecond, Wait: 100 * time.Millisecond})
				if wctx.Err() != nil {
					return
				}
				require.NoError(t, err)
				for _, m := range msgs {
					switch {
					case poison(m.MessageID):
						// Never settled: its lease expires, and a later receive
						// dead-letters it after its last attempt.
					case rng.IntN(4) == 0:
						time.Sleep(120 * time.Millisecond) // a stalled consumer: the lease expires mid-handler
						ack(m.Receipt)
					default:
						ack(m.Receipt)
					}
				}
			}
		}()
	}

	waitEmpty(t, pool, q, 60*time.Second)
	stop()
	wg.Wait()

	dead := deadLetters(t, pool, dlq)
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		id := fmt.Sprintf("m-%04d", i)
		a, d := acked[id], dead[id]
		require.Equal(t, 1, a+d, "message %s: acked %d times, dead-lettered %d times", id, a, d)
		if poison(id) {
			require.Equal(t, 1, d, "poison message %s must be dead-lettered", id)
		}
	}
	require.Equal(t, n, len(acked)+len(dead), "no message unaccounted for")
	t.Logf("acked %d, dead-lettered %d, stale acks refused %d, long handlers %d", len(acked), len(dead), lostAcks.Load(), longHandlers.Load())
	require.Positive(t, lostAcks.Load()+int64(len(dead)-n/10), "the stalls must have cost some leases")
}

// FIFO: a group never has two messages in flight, and each group's messages are
// processed in send order, while several workers share the queue. A watcher checks
// the database for two leased messages of one group at any moment.
//
// The workers hold their leases as a real worker does: a lease (20 s) far longer
// than any stall of a loaded machine, extended while the handler runs. With a 2 s
// lease, make test at load 5 twice saw a message handled twice: a lease that ran out
// between the handler's return and its ack (Work extends only while the handler runs)
// is redelivered, which is at-least-once, not a FIFO fault; freezing the test process
// for 3 s (SIGSTOP) reproduced it every time. So a message handled twice here is a
// real double delivery, and a lost lease (counted from the workers' log) is reported
// with it.
func TestFIFOGroupsOneInFlightInOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	const lease = 20 * time.Second
	q := newQueue(t, pool, &messages.QueueConfig{FIFO: true, VisibilityTimeout: lease, MaxDeliveryAttempts: 100})
	var logs lockedBuffer
	c, err := messages.NewClient(pool, &messages.ClientConfig{
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	require.NoError(t, err)

	const groups, per = 8, 15
	for i := range per {
		for g := range groups {
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(i), GroupKey: fmt.Sprintf("g%d", g)})
			require.NoError(t, err)
		}
	}

	var mu sync.Mutex
	done := map[string][]int{}
	inFlight := map[string]int{}
	var violations atomic.Int64
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the database never shows two live leases in one group
		defer wg.Done()
		for wctx.Err() == nil {
			var bad int
			err := pool.QueryRow(wctx, `SELECT count(*) FROM (SELECT group_key FROM streamd.messages
				WHERE stream_name = $1 AND lease_token IS NOT NULL AND visibility_timeout > now()
				GROUP BY group_key HAVING count(*) > 1) x`, q).Scan(&bad)
			if wctx.Err() != nil {
				return
			}
			require.NoError(t, err)
			violations.Add(int64(bad))
		}
	}()
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(3, uint64(w)))
			var rmu sync.Mutex
			err := c.Work(wctx, q, &messages.WorkerConfig{Concurrency: 4, VisibilityTimeout: lease,
				PollWait: 50 * time.Millisecond, Backoff: func(int) time.Duration { return 0 }},
				func(ctx context.Context, m *messages.Message) error {
					mu.Lock()
					inFlight[m.GroupKey]++
					if inFlight[m.GroupKey] > 1 {
						violations.Add(1)
					}
					mu.Unlock()
					rmu.Lock()
					fail := rng.IntN(5) == 0
					rmu.Unlock()
					time.Sleep(time.Millisecond) // some work
					mu.Lock()
					defer mu.Unlock()
					inFlight[m.GroupKey]--
					if fail {
						return errors.New("transient") // nacked: must come back before the next of its group
					}
					var seq int
					require.NoError(t, json.Unmarshal(m.Data, &seq))
					done[m.GroupKey] = append(done[m.GroupKey], seq)
					return nil
				})
			require.NoError(t, err)
		}()
	}
	waitEmpty(t, pool, q, 60*time.Second)
	stop()
	wg.Wait()

	lost := strings.Count(logs.String(), "lease lost")
	require.Zero(t, violations.Load(), "two messages of one group were in flight at once")
	want := make([]int, per)
	for i := range want {
		want[i] = i
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, done, groups)
	for g, seqs := range done {
		require.Equal(t, want, seqs, "group %s out of order (leases lost: %d)", g, lost)
	}
	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.message_groups WHERE stream_name = $1", q).Scan(&rows))
	require.Zero(t, rows, "empty groups leave no row")
}

// lockedBuffer is an io.Writer safe for concurrent use (a logger's output).
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// FIFO groups are served round robin: a group with a backlog does not starve a group
// that arrived later.
func TestFIFOGroupsServedFairly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q := setup(t, clock, &messages.QueueConfig{FIFO: true})
	for i := range 5 {
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(i), GroupKey: "a"})
		require.NoError(t, err)
		clock.Advance(time.Millisecond)
	}
	for _, g := range []string{"b", "c"} {
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(0), GroupKey: g})
		require.NoError(t, err)
		clock.Advance(time.Millisecond)
	}
	var order []string
	for range 7 {
		m, err := c.Receive(ctx, q, nil)
		require.NoError(t, err)
		require.Len(t, m, 1)
		order = append(order, m[0].GroupKey)
		clock.Advance(time.Millisecond)
		require.NoError(t, c.Ack(ctx, m[0].Receipt))
		clock.Advance(time.Millisecond)
	}
	require.Equal(t, []string{"a", "b", "c", "a", "a", "a", "a"}, order)

	// A batch receive takes one message per group.
	for g := range 3 {
		for i := range 2 {
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(i), GroupKey: fmt.Sprint("x", g)})
			require.NoError(t, err)
		}
	}
	m, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
	require.NoError(t, err)
	require.Len(t, m, 3)
}

// TestFIFOHeadLookupIsIndexedByTenant: a group's head is looked up by queue, group key
// and tenant (migration 0014); the index leads with all three (migration 0015), so
// another tenant's messages in the same group key are not read past. With the old
// index, each of the 2,000 was a row removed by a filter, in every receive and
// settlement (100,000 made a receive take 130 ms).
func TestFIFOHeadLookupIsIndexedByTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	q := newQueue(t, pool, &messages.QueueConfig{FIFO: true})
	_, err := pool.Exec(ctx, `INSERT INTO streamd.messages (stream_name, message_id, data, group_key, tenant_id)
		SELECT $1, 'm' || i, '{}', 'a', 'acme' FROM generate_series(1, 2000) i`, q)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO streamd.messages (stream_name, message_id, data, group_key) VALUES ($1, 'mine', '{}', 'a')`, q)
	require.NoError(t, err)

	// The head lookup of queue_receive, queue_groups_advance and queue_discard, planned
	// as in those functions (generic plan, no sequential scan).
	var plan string
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off; SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `PREPARE head(text, text, text) AS SELECT m."offset" FROM streamd.queue_messages m
			WHERE m.stream_name = $1 AND m.group_key = $2 AND coalesce(m.tenant_id, '') = $3 ORDER BY m."offset" LIMIT 1`); err != nil {
			return err
		}
		defer func() { _, _ = tx.Exec(ctx, "DEALLOCATE head") }()
		rows, err := tx.Query(ctx, fmt.Sprintf(`EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE head('%s', 'a', '')`,
			strings.ReplaceAll(q, "'", "''")))
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		plan = strings.Join(lines, "\n")
		return err
	}))
	require.NotContains(t, plan, "Rows Removed by Filter", "the head lookup reads past other tenants' rows:\n%s", plan)
}

// sendersScene is the concurrent send tests' setting: a context that ends after a
// minute, the test pool, a new standard queue and a Client.
func sendersScene(t *testing.T) (context.Context, *pgxpool.Pool, string, *messages.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	pool := testdb.Pool(t)
	return ctx, pool, newQueue(t, pool, nil), newClient(t, pool, nil)
}

// The common send (client-made ids, JSON only: one statement, not queue_send) under
// concurrency: senders race receivers that ack what they get. Each send's results
// name the messages it stored (offset and id, in batch order), every message sent is
// received and acked exactly once, and none is left (Q1).
func TestConcurrentCommonSendsWithLiveReceivers(t *testing.T) {
	t.Parallel()
	ctx, pool, q, c := sendersScene(t)
	const senders, batches, batch = 3, 10, 20
	const total = senders * batches * batch

	var mu sync.Mutex
	sent := map[string]int64{} // message id -> offset, from the send's results
	acked := map[string]int{}
	received := map[string]int64{} // message id -> offset, as received
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				msgs := make([]messages.OutgoingMessage, batch)
				for i := range msgs {
					msgs[i] = messages.OutgoingMessage{Data: json.RawMessage(fmt.Sprintf(`{"s":%d,"b":%d,"i":%d}`, s, b, i))}
				}
				res, err := c.Send(ctx, q, msgs...)
				require.NoError(t, err)
				require.Len(t, res, batch)
				mu.Lock()
				for _, r := range res {
					sent[r.MessageID] = r.Offset
				}
				mu.Unlock()
			}
		}()
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rctx.Err() == nil {
				got, err := c.Receive(rctx, q, &messages.ReceiveOpts{Max: 15, Wait: 200 * time.Millisecond})
				if rctx.Err() != nil {
					return
				}
				require.NoError(t, err)
				for _, m := range got {
					require.NoError(t, c.Ack(ctx, m.Receipt))
					mu.Lock()
					acked[m.MessageID]++
					received[m.MessageID] = m.Offset
					if len(acked) == total {
						stop()
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(t, ctx.Err(), "every message received before the deadline")
	require.Len(t, sent, total, "every send's results name distinct messages")
	for id, n := range acked {
		require.Equal(t, 1, n, "message %s acked %d times", id, n)
		require.Contains(t, sent, id, "a received message no send reported")
		require.Equal(t, sent[id], received[id], "message %s: the send's offset is the stored one", id)
	}
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_messages WHERE stream_name = $1`, q).Scan(&left))
	require.Zero(t, left)
}

// A batch's offsets are consecutive, in batch order, while other sends to the queue
// run: each send reserves its offsets in blocks of 128 (one nextval of the queue's
// sequence per block; migration 0205), the common send (one statement) and
// queue_send's paths alike. With one nextval per message, concurrent sends
// interleaved their offsets. A batch larger than a block is consecutive within each
// block, and offsets stay unique.
func TestConcurrentSendsTakeConsecutiveOffsets(t *testing.T) {
	t.Parallel()
	ctx, pool, q, c := sendersScene(t)
	const senders, batches = 4, 15
	var mu sync.Mutex
	seen := map[int64]bool{}
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() { // owner: the test; exits after its batches
			defer wg.Done()
			for b := range batches {
				n := 100
				if b%5 == 4 {
					n = 300 // three blocks
				}
				msgs := make([]messages.OutgoingMessage, n)
				for i := range msgs {
					msgs[i] = messages.OutgoingMessage{Data: json.RawMessage(fmt.Sprintf(`{"s":%d,"b":%d,"i":%d}`, s, b, i))}
					if s%2 == 1 {
						msgs[i].Headers = map[string]string{"via": "queue_send"}
					}
				}
				res, err := c.Send(ctx, q, msgs...)
				require.NoError(t, err)
				require.Len(t, res, n)
				for i, r := range res {
					require.Equal(t, res[i-i%128].Offset+int64(i%128), r.Offset,
						"sender %d batch %d: message %d's offset after message %d's %d", s, b, i, i-i%128, res[i-i%128].Offset)
				}
				mu.Lock()
				for _, r := range res {
					require.False(t, seen[r.Offset], "offset %d twice", r.Offset)
					seen[r.Offset] = true
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	var stored int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_messages WHERE stream_name = $1`, q).Scan(&stored))
	require.Equal(t, len(seen), stored)
}

// TestSendsOverABlockWithBlocksApart: a send of more than one block of offsets
// (128) whose blocks are not consecutive stores each message at the offset its result
// names, through the direct send and through queue_send alike. Another session's
// nextval between one send's blocks is what makes them apart under concurrency; here
// a sequence cache of 2 makes it so at once: session A's first send takes the first
// value of its cache, B's the first of the next pair, and A's send of 300 then takes
// its cached second value and a pair past B's (three blocks, the second and third
// apart from the first). An expansion of the blocks that assumes them consecutive
// stores message 128 at B's offset (a duplicate key) or where its result does not say.
func TestSendsOverABlockWithBlocksApart(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"direct", "queue_send"} {
		t.Run(via, func(t *testing.T) {
			ctx, pool, q, c := sendersScene(t)
			var seq string
			require.NoError(t, pool.QueryRow(ctx, `SELECT offset_seq::text FROM streamd.queues WHERE queue_name = $1`, q).Scan(&seq))
			_, err := pool.Exec(ctx, `ALTER SEQUENCE `+seq+` CACHE 2`)
			require.NoError(t, err)
			a, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer a.Release()
			b, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer b.Release()
			batch := func(n int) []messages.OutgoingMessage {
				msgs := make([]messages.OutgoingMessage, n)
				for i := range msgs {
					msgs[i] = messages.OutgoingMessage{Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
					if via == "queue_send" {
						msgs[i].Headers = map[string]string{"via": via}
					}
				}
				return msgs
			}
			sent := map[string]int64{}
			for _, step := range []struct {
				conn *pgxpool.Conn
				n    int
			}{{a, 1}, {b, 1}, {a, 300}} {
				res, err := c.SendTx(ctx, step.conn, q, batch(step.n)...)
				require.NoError(t, err)
				for _, r := range res {
					sent[r.MessageID] = r.Offset
				}
			}
			require.Len(t, sent, 302)
			rows, err := pool.Query(ctx, `SELECT message_id, "offset" FROM streamd.queue_messages WHERE stream_name = $1`, q)
			require.NoError(t, err)
			stored := map[string]int64{}
			for rows.Next() {
				var id string
				var off int64
				require.NoError(t, rows.Scan(&id, &off))
				stored[id] = off
			}
			require.NoError(t, rows.Err())
			require.Equal(t, sent, stored, "each message at the offset its send's result names")
		})
	}
}
