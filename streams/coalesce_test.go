package streams_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// produceResult is one Produce call's outcome, from its goroutine.
type produceResult struct {
	pos []streams.Position
	err error
}

// goProduce calls c.Produce(ctx, recs...) on a goroutine of its own.
func goProduce(ctx context.Context, c *streams.Client, recs ...streams.Record) <-chan produceResult {
	out := make(chan produceResult, 1)
	go func() {
		pos, err := c.Produce(ctx, recs...)
		out <- produceResult{pos, err}
	}()
	return out
}

// holdTheLine makes the next Produce call of c to stream's partition 0 the one
// transaction c runs (MaxAppendsInFlight 1) and keeps it waiting for the head row,
// which the returned transaction locks; calls made after it queue. Committing the
// transaction lets it go. The call's result comes on the channel.
func holdTheLine(t *testing.T, pool *pgxpool.Pool, c *streams.Client, stream string) (pgx.Tx, <-chan produceResult) {
	t.Helper()
	ctx := context.Background()
	tx := lockHead(t, pool, stream, 0)
	first := goProduce(ctx, c, streams.Record{Stream: stream, Partition: streams.PartitionOf(0), EventID: "first", Data: json.RawMessage(`0`)})
	testdb.WaitForLockWait(t, pool, tx, "head_reserve($1, $2, 1)")
	return tx, first
}

// oneSlotClient returns the test pool, a client that runs one append transaction at
// a time (MaxAppendsInFlight 1: calls made meanwhile wait to share the next), and a
// new stream of the given partitions.
func oneSlotClient(t *testing.T, partitions int32) (*pgxpool.Pool, *streams.Client, string) {
	t.Helper()
	pool := testdb.Pool(t)
	c := streams.NewClient(pool, &streams.ClientConfig{MaxAppendsInFlight: 1})
	c.SetAppendStallAfter(time.Hour) // the tests hold the slot's transaction on a lock
	s := testdb.Name("s")
	require.NoError(t, c.CreateStream(context.Background(), s, partitions))
	return pool, c, s
}

// lockHead locks partition's head row of stream in a transaction of its own, which
// the test commits or rolls back (or its cleanup rolls back): appends to that
// partition wait for it.
func lockHead(t *testing.T, pool *pgxpool.Pool, stream string, partition int32) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, `SELECT 1 FROM streamd.stream_partitions WHERE stream_name = $1 AND partition = $2 FOR UPDATE`, stream, partition)
	require.NoError(t, err)
	return tx
}

// lockHeads locks every head row of stream in a transaction of its own, which the
// test commits (or its cleanup rolls back), and returns it with a function that waits
// until want one-record appends wait for those locks.
func lockHeads(t *testing.T, pool *pgxpool.Pool, stream string) (pgx.Tx, func(want int)) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, `SELECT 1 FROM streamd.stream_partitions WHERE stream_name = $1 FOR UPDATE`, stream)
	require.NoError(t, err)
	blocker := tx.Conn().PgConn().PID()
	return tx, func(want int) {
		testdb.WaitFor(t, 20*time.Second, "appends waiting for the test's locks", func() bool {
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND position('head_reserve($1, $2, 1)' IN query) > 0
				  AND $1::int = ANY (pg_blocking_pids(pid))`, blocker).Scan(&n))
			return n == want
		})
	}
}

// xmins returns the inserting transaction of each event of stream, by event id.
func xmins(t *testing.T, pool *pgxpool.Pool, stream string) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id, xmin::text FROM streamd.events WHERE stream_name = $1`, stream)
	require.NoError(t, err)
	out := map[string]string{}
	for rows.Next() {
		var id, x string
		require.NoError(t, rows.Scan(&id, &x))
		out[id] = x
	}
	require.NoError(t, rows.Err())
	return out
}

// requireGapless checks that every partition of stream holds offsets 0, 1, 2, ... and
// that each event id is stored once (L1, L4).
func requireGapless(t *testing.T, c *streams.Client, stream string, partitions int32) {
	t.Helper()
	seen := map[string]bool{}
	for p := range partitions {
		res, err := c.Fetch(context.Background(), stream, p, 0, &streams.FetchOpts{MaxRecords: 1000})
		require.NoError(t, err)
		for i, e := range res.Events {
			require.Equal(t, int64(i), e.Offset, "partition %d", p)
			require.False(t, seen[e.EventID], "event %s stored twice", e.EventID)
			seen[e.EventID] = true
		}
	}
}

// Calls made while the client's one transaction runs wait, and are appended together
// in one transaction, each with its own positions.
func TestConcurrentProduceCallsShareTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, c, s := oneSlotClient(t, 2)
	tx, first := holdTheLine(t, pool, c, s)

	before := streams.CoalescedAppends()
	calls := make([][]streams.Record, 6)
	results := make([]<-chan produceResult, len(calls))
	for i := range calls {
		p := streams.PartitionOf(int32(i % 2))
		for j := range 1 + i%3 { // 1, 2 or 3 records
			calls[i] = append(calls[i], streams.Record{Stream: s, Partition: p, EventID: fmt.Sprintf("c%d-%d", i, j),
				Data: json.RawMessage(fmt.Sprintf(`{"call":%d}`, i))})
		}
		results[i] = goProduce(ctx, c, calls[i]...)
		testdb.WaitFor(t, 5*time.Second, "the call to wait", func() bool { return c.AppendsWaiting() == i+1 })
	}
	require.NoError(t, tx.Commit(ctx))
	r := <-first
	require.NoError(t, r.err)
	require.Equal(t, int64(0), r.pos[0].Offset)

	stored := xmins(t, pool, s)
	shared := ""
	for i, ch := range results {
		r := <-ch
		require.NoError(t, r.err, "call %d", i)
		require.Len(t, r.pos, len(calls[i]))
		for j, rec := range calls[i] {
			require.Equal(t, *rec.Partition, r.pos[j].Partition)
			ev := fetchOne(t, c, s, r.pos[j])
			require.Equal(t, rec.EventID, ev.EventID, "call %d record %d", i, j)
			if shared == "" {
				shared = stored[rec.EventID]
			}
			require.Equal(t, shared, stored[rec.EventID], "call %d record %d not in the shared transaction", i, j)
		}
	}
	require.NotEqual(t, stored["first"], shared)
	require.GreaterOrEqual(t, streams.CoalescedAppends()-before, int64(len(calls)))
	requireGapless(t, c, s, 2)
}

// fetchOne returns the event at pos.
func fetchOne(t *testing.T, c *streams.Client, stream string, pos streams.Position) streams.Event {
	t.Helper()
	res, err := c.Fetch(context.Background(), stream, pos.Partition, pos.Offset, &streams.FetchOpts{MaxRecords: 1})
	require.NoError(t, err)
	require.NotEmpty(t, res.Events)
	require.Equal(t, pos.Offset, res.Events[0].Offset)
	return res.Events[0]
}

// When one call of a shared transaction fails it, every call is appended again
// alone: the failing call gets its own error and writes nothing, a duplicate event id
// is found stored (L4), and the others succeed.
func TestSharedTransactionFailureFailsOnlyItsCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, c, s := oneSlotClient(t, 2)
	stored, err := c.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(1), EventID: "dup", Data: json.RawMessage(`1`)})
	require.NoError(t, err)
	tx, first := holdTheLine(t, pool, c, s)

	rec := func(p int32, id string) streams.Record {
		return streams.Record{Stream: s, Partition: streams.PartitionOf(p), EventID: id, Data: json.RawMessage(`2`)}
	}
	var results []<-chan produceResult
	for _, recs := range [][]streams.Record{
		{rec(0, "good1")},
		{rec(5, "bad1"), rec(5, "bad2")}, // no partition 5: SD002
		{rec(1, "dup")},
		{rec(1, "good2"), rec(1, "good3")},
	} {
		results = append(results, goProduce(ctx, c, recs...))
		n := len(results)
		testdb.WaitFor(t, 5*time.Second, "the call to wait", func() bool { return c.AppendsWaiting() == n })
	}
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, (<-first).err)

	good1, bad, dup, good2 := <-results[0], <-results[1], <-results[2], <-results[3]
	require.NoError(t, good1.err)
	require.True(t, errors.Is(bad.err, streams.ErrPartitionNotFound), "got %v", bad.err)
	require.Nil(t, bad.pos)
	require.NoError(t, dup.err)
	require.True(t, dup.pos[0].Duplicate)
	require.Equal(t, stored[0].Offset, dup.pos[0].Offset)
	require.NoError(t, good2.err)
	require.Equal(t, "good1", fetchOne(t, c, s, good1.pos[0]).EventID)
	require.Equal(t, "good2", fetchOne(t, c, s, good2.pos[0]).EventID)
	require.Equal(t, "good3", fetchOne(t, c, s, good2.pos[1]).EventID)

	ids := xmins(t, pool, s)
	require.Len(t, ids, 5) // dup, first, good1, good2, good3
	require.NotEqual(t, ids["good1"], ids["good2"], "the shared transaction was not rolled back")
	requireGapless(t, c, s, 2)
}

// A call that waits for a transaction to share returns ctx's error when ctx ends
// before one takes it, and writes nothing.
func TestWaitingProduceCallLeavesOnCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, c, s := oneSlotClient(t, 1)
	tx, first := holdTheLine(t, pool, c, s)

	cctx, cancel := context.WithCancel(ctx)
	gone := goProduce(cctx, c, streams.Record{Stream: s, Partition: streams.PartitionOf(0), EventID: "gone", Data: json.RawMessage(`1`)})
	testdb.WaitFor(t, 5*time.Second, "the call to wait", func() bool { return c.AppendsWaiting() == 1 })
	cancel()
	r := <-gone
	require.ErrorIs(t, r.err, context.Canceled)
	require.Zero(t, c.AppendsWaiting())

	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, (<-first).err)
	after, err := c.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(0), EventID: "after", Data: json.RawMessage(`2`)})
	require.NoError(t, err)
	require.Equal(t, int64(1), after[0].Offset)
	require.NotContains(t, xmins(t, pool, s), "gone")
}

// A call of more than 16 records never waits for a transaction to share: it runs
// alone at once, even while the client's one transaction is held.
func TestLargeProduceCallRunsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, c, s := oneSlotClient(t, 2)
	tx, first := holdTheLine(t, pool, c, s)

	recs := make([]streams.Record, 17)
	for i := range recs {
		recs[i] = streams.Record{Stream: s, Partition: streams.PartitionOf(1), Data: json.RawMessage(`1`)}
	}
	alone, cancel := context.WithTimeout(ctx, 10*time.Second) // a call that waited would wait for the held line
	defer cancel()
	pos, err := c.Produce(alone, recs...)
	require.NoError(t, err)
	require.Len(t, pos, 17)
	require.Equal(t, int64(16), pos[16].Offset)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, (<-first).err)
}

// By default a client runs two transactions of its small appends at once
// (DefaultMaxAppendsInFlight), whatever its pool's size: calls made while two run
// wait and share the next one. (Here the two are held on a lock for as long as the
// test needs, so they are not let count as stalled; a stalled one frees its slot:
// TestBlockedAppendsDoNotStallOtherStreams.)
func TestDefaultSharesBeyondTwoInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	cfg := testdb.Config(t)
	cfg.MaxConns = 4 // connections to spare: the calls wait for a slot, not a connection
	small, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(small.Close)
	c := streams.NewClient(small, nil)
	c.SetAppendStallAfter(time.Hour)
	s := testdb.Name("s")
	require.NoError(t, c.CreateStream(ctx, s, 2))

	tx, waitBlocked := lockHeads(t, pool, s)
	rec := func(p int32, id string) streams.Record {
		return streams.Record{Stream: s, Partition: streams.PartitionOf(p), EventID: id, Data: json.RawMessage(`1`)}
	}
	held := []<-chan produceResult{goProduce(ctx, c, rec(0, "a")), goProduce(ctx, c, rec(1, "b"))}
	waitBlocked(2)
	waiting := []<-chan produceResult{goProduce(ctx, c, rec(0, "c"))}
	testdb.WaitFor(t, 5*time.Second, "the call to wait", func() bool { return c.AppendsWaiting() == 1 })
	waiting = append(waiting, goProduce(ctx, c, rec(1, "d")))
	testdb.WaitFor(t, 5*time.Second, "the call to wait", func() bool { return c.AppendsWaiting() == 2 })
	require.NoError(t, tx.Commit(ctx))
	for _, ch := range append(held, waiting...) {
		require.NoError(t, (<-ch).err)
	}
	ids := xmins(t, pool, s)
	require.Len(t, ids, 4)
	require.Equal(t, ids["c"], ids["d"], "the calls that waited did not share a transaction")
	require.NotEqual(t, ids["a"], ids["b"])
	requireGapless(t, c, s, 2)
}

// A call taken into a shared transaction keeps its own ctx: when it ends, the shared
// transaction rolls back (releasing the head rows its statements locked) and the call
// returns its ctx's error at once, instead of waiting for another call's statement
// that waits for a head row (here partition 2's, held by an outside transaction).
func TestTakenCallKeepsItsContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, c, s := oneSlotClient(t, 3)
	outside := lockHead(t, pool, s, 2)

	tx, first := holdTheLine(t, pool, c, s)
	blocked := goProduce(ctx, c, streams.Record{Stream: s, Partition: streams.PartitionOf(2), EventID: "p2", Data: json.RawMessage(`2`)})
	testdb.WaitFor(t, 5*time.Second, "the call to wait", func() bool { return c.AppendsWaiting() == 1 })
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := goProduce(wctx, c, streams.Record{Stream: s, Partition: streams.PartitionOf(1), EventID: "w", Data: json.RawMessage(`1`)})
	testdb.WaitFor(t, 5*time.Second, "the call to wait", func() bool { return c.AppendsWaiting() == 2 })
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, (<-first).err)
	// The shared transaction: w's statement (partition 1) ran, p2's waits for the head row.
	testdb.WaitForLockWait(t, pool, outside, "head_reserve($1, $2, 1)")

	cancel()
	select {
	case r := <-w:
		require.ErrorIs(t, r.err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("a call taken into a shared transaction waited past its ctx for another call's head row")
	}
	// Partition 1's head row is free again: another client appends to it.
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	defer acancel()
	_, err := streams.NewClient(pool, nil).Produce(actx, streams.Record{Stream: s, Partition: streams.PartitionOf(1), EventID: "other", Data: json.RawMessage(`1`)})
	require.NoError(t, err)
	require.NoError(t, outside.Commit(ctx))
	require.NoError(t, (<-blocked).err, "the other call, appended alone")
	stored := xmins(t, pool, s)
	require.NotContains(t, stored, "w", "the cancelled call stored nothing")
	require.Contains(t, stored, "p2")
	requireGapless(t, c, s, 3)
}

// panicOnSharedBatch panics in the first batch of more than one statement sent while
// armed (a shared transaction), as a bug in a tracer or in the path would.
type panicOnSharedBatch struct{ armed atomic.Bool }

func (*panicOnSharedBatch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (*panicOnSharedBatch) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (p *panicOnSharedBatch) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if d.Batch.Len() > 1 && p.armed.CompareAndSwap(true, false) {
		panic("injected")
	}
	return ctx
}
func (*panicOnSharedBatch) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*panicOnSharedBatch) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// panicScene sets up a leader that panics: a client running one append transaction
// at a time over a pool of its own traced by tracer, whose queued call "leader"
// (partition 1) leads a shared transaction with the call "taken" (partition 0), arm
// being called just before that transaction starts. It returns the test pool, the
// traced pool (closing it is the caller's), the client, the stream, the leader's
// recovered panic and the taken call's result.
func panicScene(t *testing.T, tracer pgx.QueryTracer, arm func()) (*pgxpool.Pool, *pgxpool.Pool, *streams.Client, string, <-chan any, <-chan produceResult) {
	t.Helper()
	ctx := context.Background()
	pool := testdb.Pool(t)
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	tracedPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	c := streams.NewClient(tracedPool, &streams.ClientConfig{MaxAppendsInFlight: 1})
	c.SetAppendStallAfter(time.Hour)
	s := testdb.Name("s")
	require.NoError(t, c.CreateStream(ctx, s, 2))

	tx, first := holdTheLine(t, pool, c, s)
	panicked := make(chan any, 1)
	go func() { // the leader-to-be: the first call queued
		defer func() { panicked <- recover() }()
		_, _ = c.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(1), EventID: "leader", Data: json.RawMessage(`1`)})
	}()
	testdb.WaitFor(t, 5*time.Second, "the call to wait", func() bool { return c.AppendsWaiting() == 1 })
	taken := goProduce(ctx, c, streams.Record{Stream: s, Partition: streams.PartitionOf(0), EventID: "taken", Data: json.RawMessage(`0`)})
	testdb.WaitFor(t, 5*time.Second, "the call to wait", func() bool { return c.AppendsWaiting() == 2 })
	arm()
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, (<-first).err)
	return pool, tracedPool, c, s, panicked, taken
}

// requirePanicAndTaken checks that the leader's call raised the injected panic and
// that the call it took still ended, appended alone.
func requirePanicAndTaken(t *testing.T, panicked <-chan any, taken <-chan produceResult) {
	t.Helper()
	require.Equal(t, "injected", <-panicked, "the leader's call raises the panic")
	select {
	case r := <-taken:
		require.NoError(t, r.err, "the taken call, appended alone")
	case <-time.After(10 * time.Second):
		t.Fatal("a call taken by a leader that panicked was stranded")
	}
}

// A leader that panics while sending a shared transaction raises the panic in its own
// call, and the calls it took are appended alone: none is stranded, and the client's
// transaction slot is not lost (a later call goes through).
func TestPanickingLeaderStrandsNoCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tracer := &panicOnSharedBatch{}
	pool, tracedPool, c, s, panicked, taken := panicScene(t, tracer, func() { tracer.armed.Store(true) })
	// Not closed and waited for: a panic inside pgx's SendBatch leaves the connection
	// pgx acquired for the batch checked out, and Close waits for every connection.
	t.Cleanup(func() { go tracedPool.Close() })

	requirePanicAndTaken(t, panicked, taken)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := c.Produce(actx, streams.Record{Stream: s, Partition: streams.PartitionOf(1), EventID: "later", Data: json.RawMessage(`1`)})
	require.NoError(t, err, "the transaction slot is not lost")
	stored := xmins(t, pool, s)
	require.Contains(t, stored, "taken")
	require.NotContains(t, stored, "leader", "the panicking call's shared transaction never ran")
}

// panicOnSharedResult panics while the first result of a shared transaction (a batch
// of more than one statement) is read, once armed: after the batch went out, with
// its connection checked out of the pool.
type panicOnSharedResult struct{ armed, shared atomic.Bool }

func (*panicOnSharedResult) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (*panicOnSharedResult) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (p *panicOnSharedResult) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	p.shared.Store(d.Batch.Len() > 1)
	return ctx
}
func (p *panicOnSharedResult) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	if p.shared.Load() && p.armed.CompareAndSwap(true, false) {
		panic("injected")
	}
}
func (*panicOnSharedResult) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A leader that panics while it reads its shared transaction's results gives the
// batch's connection back to the pool (before, it stayed checked out for good: one
// connection lost per panic, and the pool's Close never returned); the calls it took
// still end, each record stored once.
func TestPanicReadingSharedResultsReleasesTheConnection(t *testing.T) {
	t.Parallel()
	tracer := &panicOnSharedResult{}
	pool, tracedPool, c, s, panicked, taken := panicScene(t, tracer, func() { tracer.armed.Store(true) })
	closed := make(chan struct{})
	t.Cleanup(func() {
		go func() { tracedPool.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Error("the pool's Close waits for a connection that never came back")
		}
	})

	requirePanicAndTaken(t, panicked, taken)
	testdb.WaitFor(t, 5*time.Second, "every connection back in the pool", func() bool {
		return tracedPool.Stat().AcquiredConns() == 0
	})
	stored := xmins(t, pool, s)
	require.Len(t, stored, 3, "first, leader and taken, each once")
	requireGapless(t, c, s, 2)
}

// A shared transaction whose connection is lost (its backend terminated while one of
// its statements waits for a head row) stored nothing; every call in it is appended
// again alone and succeeds, each record stored once, the offsets gapless (L1, L4).
func TestSharedTransactionLostConnectionRetriesAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, c, s := oneSlotClient(t, 3)
	outside := lockHead(t, pool, s, 2)

	tx, first := holdTheLine(t, pool, c, s)
	p2 := goProduce(ctx, c, streams.Record{Stream: s, Partition: streams.PartitionOf(2), EventID: "p2", Data: json.RawMessage(`2`)})
	testdb.WaitFor(t, 5*time.Second, "the call to wait", func() bool { return c.AppendsWaiting() == 1 })
	p1 := goProduce(ctx, c, streams.Record{Stream: s, Partition: streams.PartitionOf(1), EventID: "p1", Data: json.RawMessage(`1`)})
	testdb.WaitFor(t, 5*time.Second, "the call to wait", func() bool { return c.AppendsWaiting() == 2 })
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, (<-first).err)
	testdb.WaitForLockWait(t, pool, outside, "head_reserve($1, $2, 1)")

	// The shared transaction's backend: the one waiting for outside's lock.
	var terminated bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE $1 = ANY(pg_blocking_pids(pid))`, outside.Conn().PgConn().PID()).Scan(&terminated))
	require.True(t, terminated)
	// Appended again alone: p1 at once, p2 once outside ends.
	r1 := <-p1
	require.NoError(t, r1.err)
	require.NoError(t, outside.Commit(ctx))
	r2 := <-p2
	require.NoError(t, r2.err)
	require.False(t, r1.pos[0].Duplicate || r2.pos[0].Duplicate, "nothing was stored by the lost transaction")
	stored := xmins(t, pool, s)
	require.Len(t, stored, 3) // first, p1, p2
	require.NotEqual(t, stored["p1"], stored["p2"], "appended alone after the lost transaction")
	requireGapless(t, c, s, 3)
}

// Callers that produce again as soon as their call returns (a producer's loop) go
// in one transaction together, not alternately in small ones: the transaction that
// ends wakes its callers before handing its slot on, and the next leader lets the
// goroutines ready to run join it before it sends (collect). With one transaction
// in flight and 4 such callers, a handover without that makes every other
// transaction hold a single call (half as many transactions as calls); with it
// they hold about 3.
func TestLoopingCallersShareOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, c, s := oneSlotClient(t, 4)
	const callers, calls = 4, 40
	errs := make(chan error, callers)
	for w := range callers {
		go func() {
			for i := range calls {
				_, err := c.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(int32(w)),
					EventID: fmt.Sprintf("w%d-%d", w, i), Data: json.RawMessage(`1`)})
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range callers {
		require.NoError(t, <-errs)
	}
	txs := map[string]bool{}
	for _, x := range xmins(t, pool, s) {
		txs[x] = true
	}
	t.Logf("%d calls in %d transactions", callers*calls, len(txs))
	require.LessOrEqual(t, len(txs)*10, callers*calls*4, "the callers split into transactions of about 2 calls or fewer")
	requireGapless(t, c, s, callers)
}
