package kafka

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// tailsOff turns ts's tail readers off: tests of the fetches' own reads.
func tailsOff(ts *testServer) {
	ts.srv.tails.mu.Lock()
	defer ts.srv.tails.mu.Unlock()
	ts.srv.tails.off = true
}

// tailOpts sets the tail readers' idle time, check interval and read hook, for the
// readers started from now on.
func tailOpts(ts *testServer, idle, check time.Duration, hook func(topic string, partition int32)) {
	ts.srv.tails.mu.Lock()
	defer ts.srv.tails.mu.Unlock()
	ts.srv.tails.idle, ts.srv.tails.check, ts.srv.tails.readHook = idle, check, hook
}

// tailHolds reports whether ts has a reader of topic/partition that has read up to
// offset next.
func tailHolds(ts *testServer, topic string, partition int32, next int64) bool {
	r := ts.srv.tails.get(partKey{topic, partition})
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.stopped && r.next >= next
}

// readCounter counts the statements about one stream, the tail readers' apart.
type readCounter struct {
	stream       string
	fetch, tails atomic.Int64
}

func (c *readCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if len(d.Args) > 0 && d.Args[0] == c.stream {
		if ctx.Value(tailReadKey{}) != nil {
			c.tails.Add(1)
		} else {
			c.fetch.Add(1)
		}
	}
	return ctx
}

func (c *readCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestTailReaderAnswersFromMemory: once a fetch found two partitions at their log
// end, their tail readers read the records appended by a plain SQL INSERT and by a
// Kafka Produce, each on its partition's wake-up, and the consumer's fetches (a long
// poll at the log end, then a fetch of what was read) are answered from memory:
// they run no statement of their own about the stream.
func TestTailReaderAnswersFromMemory(t *testing.T) {
	t.Parallel()
	topic := testdb.Name("tailmem")
	rc := &readCounter{stream: topic}
	hub := wakeup.NewHub()
	ts := startServer(t, tracedPool(t, rc), &Config{Wakeups: hub})
	ctx := testCtx(t)
	pool := testdb.Pool(t)
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 2))
	cl := newClient(t, []string{ts.addr})
	req := fetchReq(topic, 0, 0, 0, 1)
	addFetchPartition(req, 1, 0)
	_, err := req.RequestWith(ctx, cl) // at the log end: starts both readers
	require.NoError(t, err)
	require.Eventually(t, func() bool { return tailHolds(ts, topic, 0, 0) && tailHolds(ts, topic, 1, 0) }, 10*time.Second, time.Millisecond)

	before, readBefore := rc.fetch.Load(), ts.srv.tails.read.Load()
	req.MaxWaitMillis = 10_000
	done := fetchWaiting(t, ctx, ts, cl, req)
	_, err = pool.Exec(ctx, `INSERT INTO streamd.events (stream_name, partition, data_bytes) VALUES ($1, 0, $2)`, topic, []byte("by sql"))
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 0) // what the tailer does after the commit
	resp := answerOf(t, done, "no answer within 15s")
	ps := resp.Topics[0].Partitions
	recs := recordsOf(t, ps[0].RecordBatches)
	require.Len(t, recs, 1)
	require.Equal(t, "by sql", string(recs[0].Value))
	require.Equal(t, int64(1), ps[0].HighWatermark)
	require.Empty(t, ps[1].RecordBatches)
	require.Zero(t, rc.fetch.Load()-before, "the long poll ran statements of its own about the stream")

	// A Kafka Produce into partition 1 (its statements are the server's too).
	pcl := newClient(t, []string{ts.addr}, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, pcl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 1, Value: []byte("by kafka")}).FirstErr())
	hub.NotifyPartitions(topic, 1)
	require.Eventually(t, func() bool { return tailHolds(ts, topic, 1, 1) }, 10*time.Second, time.Millisecond)
	before = rc.fetch.Load()
	req.Topics[0].Partitions[0].FetchOffset = 1
	resp, err = req.RequestWith(ctx, cl)
	require.NoError(t, err)
	ps = resp.Topics[0].Partitions
	require.Empty(t, ps[0].RecordBatches)
	recs = recordsOf(t, ps[1].RecordBatches)
	require.Len(t, recs, 1)
	require.Equal(t, "by kafka", string(recs[0].Value))
	require.Equal(t, []int64{1, 1}, []int64{ps[0].HighWatermark, ps[1].HighWatermark})
	require.Zero(t, rc.fetch.Load()-before, "the fetch ran statements of its own about the stream")
	require.Equal(t, readBefore, ts.srv.tails.read.Load(), "a fetch read the log")
	require.Equal(t, int64(2), ts.srv.tails.answered.Load(), "the readers answered both fetches")
	require.Positive(t, rc.tails.Load(), "the readers read")
}

// TestTailReaderSlowPartitionDoesNotDelayAnother: with partition 0's reader stuck in
// a read, a record of partition 1 reaches a consumer waiting at the log end of both
// at once (each partition's reader reads on its own), and partition 0's record once
// that read ends.
func TestTailReaderSlowPartitionDoesNotDelayAnother(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	hub := wakeup.NewHub()
	ts := startServer(t, pool, &Config{Wakeups: hub})
	topic := testdb.Name("tailslow")
	g := newReadGate(t) // after startServer: released before the server stops, which waits for the readers
	blocking, stuck, releaseAll := &g.armed, g.stuck, g.releaseAll
	hold := func(tp string, p int32) {
		if tp == topic && p == 0 {
			g.wait()
		}
	}
	ts.srv.fetchReadHook = hold // the fetches' own reads of partition 0 too
	tailOpts(ts, 0, 0, hold)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 2))
	cl := newClient(t, []string{ts.addr})
	req := fetchReq(topic, 0, 0, 0, 1)
	addFetchPartition(req, 1, 0)
	_, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return tailHolds(ts, topic, 0, 0) && tailHolds(ts, topic, 1, 0) }, 10*time.Second, time.Millisecond)

	req.MaxWaitMillis = 20_000
	done := fetchWaiting(t, ctx, ts, cl, req)
	blocking.Store(true)
	_, err = sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: []byte("slow")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 0)
	waitStuck(t, stuck)
	blocking.Store(false)
	_, err = sc.AppendPartition(ctx, topic, 1, []streams.Record{{Bytes: []byte("fast")}}, nil)
	require.NoError(t, err)
	start := time.Now()
	hub.NotifyPartitions(topic, 1)
	resp := answerOf(t, done, "partition 1's record waits for partition 0's read")
	require.Less(t, time.Since(start), 5*time.Second)
	ps := resp.Topics[0].Partitions
	require.Len(t, recordsOf(t, ps[1].RecordBatches), 1, "partition 1's record")
	require.Empty(t, ps[0].RecordBatches, "partition 0's read is still under way")

	releaseAll()
	require.Eventually(t, func() bool { return tailHolds(ts, topic, 0, 1) }, 10*time.Second, time.Millisecond)
	req.Topics[0].Partitions[1].FetchOffset = 1
	resp, err = req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Len(t, recordsOf(t, resp.Topics[0].Partitions[0].RecordBatches), 1, "partition 0's record once its read ended")
}

// TestTailReadersStopAndRestartGapless: writers append to four partitions (the
// client and plain SQL), in rounds the consumer catches up with (so that it reaches
// the log end, where the readers start), while a franz-go consumer reads them with
// small fetch bounds and the partitions' tail readers are stopped each time they
// answered a fetch (as the local DeleteRecords stops them) and started again by the
// fetches: every record arrives exactly once, in offset order, from 0 with no gap,
// whether from a reader or from the log. A second consumer then reads from offset 0,
// below what the readers hold: from the log.
func TestTailReadersStopAndRestartGapless(t *testing.T) {
	t.Parallel()
	const partitions, writers, rounds, perRound = 4, 4, 8, 20 // perRound: per writer
	const total = writers * rounds * perRound
	l := newLiveScene(t, "tailgap", partitions)
	pool, hub, ts, ctx, topic, sc, cl, offsets := l.pool, l.hub, l.ts, l.ctx, l.topic, l.sc, l.cl, l.offsets

	var got atomic.Int64 // records the consumer has
	stop := make(chan struct{})
	var dropped atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // stops the readers each time they answered a fetch since the last stop
		defer wg.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		last := int64(0)
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if a := ts.srv.tails.answered.Load(); a > last {
					last = a
					dropped.Add(int64(ts.srv.tails.count()))
					ts.srv.tails.drop(topic)
				}
			}
		}
	}()
	errs := make(chan error, writers+1)
	wg.Add(1)
	go func() { // the rounds
		defer wg.Done()
		for round := range rounds {
			var ww sync.WaitGroup
			for w := range writers {
				ww.Add(1)
				go func() {
					defer ww.Done()
					for i := range perRound {
						p := int32((w + i) % partitions)
						val := fmt.Sprintf("r%d-w%d-%03d-%s", round, w, i, string(make([]byte, 100)))
						if err := writeLive(ctx, pool, sc, hub, topic, w, p, val); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			ww.Wait()
			want := int64((round + 1) * writers * perRound)
			deadline := time.Now().Add(30 * time.Second)
			for got.Load() < want { // the consumer catches up before the next round
				if time.Now().After(deadline) {
					errs <- fmt.Errorf("round %d: the consumer has %d of %d records after 30s", round, got.Load(), want)
					return
				}
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}
	}()

	next := consumeGapless(t, ctx, cl, int(total), &got, errs, 90*time.Second)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	l.requireReadToTheEnd(t, next)

	// A second consumer from offset 0, below what the readers hold now: from the log.
	cl2 := newClient(t, []string{ts.addr}, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}))
	var got2 atomic.Int64
	consumeGapless(t, ctx, cl2, int(total), &got2, nil, 30*time.Second)
	require.Positive(t, dropped.Load(), "readers were stopped under the consumer")
	t.Logf("readers stopped %d times; they answered %d fetches", dropped.Load(), ts.srv.tails.answered.Load())
}

// TestTailReaderDeleteRecordsAndRecreate: a reader holding records does not serve
// them past a DeleteRecords below them (OFFSET_OUT_OF_RANGE, as from the log), nor
// after DeleteTopics and CreateTopics of the same name through this server (the new
// topic's records), nor, within its check interval, after another instance deleted
// and created the stream again.
func TestTailReaderDeleteRecordsAndRecreate(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	hub := wakeup.NewHub()
	ts := startServer(t, pool, &Config{Wakeups: hub})
	ctx := testCtx(t)
	adm := newAdmin(t, ts.addr)
	sc := streams.NewClient(pool, nil)
	appendN := func(topic, prefix string, n int) {
		t.Helper()
		var recs []streams.Record
		for i := range n {
			recs = append(recs, streams.Record{Bytes: fmt.Appendf(nil, "%s-%d", prefix, i)})
		}
		_, err := sc.AppendPartition(ctx, topic, 0, recs, nil)
		require.NoError(t, err)
		hub.NotifyPartitions(topic, 0)
	}
	cl := newClient(t, []string{ts.addr})
	fetchAt := func(topic string, off int64) (int16, int64, []kgo.Record) {
		t.Helper()
		req := fetchReq(topic, 0, off, 0, 1)
		resp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		p := resp.Topics[0].Partitions[0]
		return p.ErrorCode, p.LogStartOffset, recordsOf(t, p.RecordBatches)
	}
	// warm creates topic through this server, starts its reader with a fetch at the
	// log end, and appends 10 records, which the reader reads.
	warm := func(topic string) {
		t.Helper()
		_, err := adm.CreateTopic(ctx, 1, 1, nil, topic)
		require.NoError(t, err)
		fetchAt(topic, 0)
		require.Eventually(t, func() bool { return tailHolds(ts, topic, 0, 0) }, 10*time.Second, time.Millisecond)
		appendN(topic, "old", 10)
		require.Eventually(t, func() bool { return tailHolds(ts, topic, 0, 10) }, 10*time.Second, time.Millisecond)
		code, _, recs := fetchAt(topic, 5)
		require.Zero(t, code)
		require.Equal(t, "old-5", string(recs[0].Value))
	}

	// DeleteRecords through this server.
	tailOpts(ts, 0, time.Hour, nil) // the readers started now check the stream's identity only after an hour
	topic := testdb.Name("taildel")
	warm(topic)
	dr, err := adm.DeleteRecords(ctx, kadm.Offsets{topic: {0: {At: 8}}})
	require.NoError(t, err)
	require.NoError(t, dr.Error())
	code, lso, recs := fetchAt(topic, 6)
	require.Equal(t, kerr.OffsetOutOfRange.Code, code, "not the deleted records the reader held")
	require.Equal(t, int64(8), lso)
	require.Empty(t, recs)

	// DeleteTopics and CreateTopics of the same name through this server.
	topic = testdb.Name("tailrecreate")
	warm(topic)
	_, err = adm.DeleteTopics(ctx, topic)
	require.NoError(t, err)
	_, err = adm.CreateTopic(ctx, 1, 1, nil, topic)
	require.NoError(t, err)
	appendN(topic, "new", 12)
	code, _, recs = fetchAt(topic, 5)
	require.Zero(t, code)
	require.NotEmpty(t, recs)
	require.Equal(t, "new-5", string(recs[0].Value), "the new topic's record, not the old one the reader held")

	// Another instance (the library here) moves the log start: the reader sees it
	// within its check interval.
	tailOpts(ts, 0, 50*time.Millisecond, nil)
	topic = testdb.Name("tailstartelsewhere")
	warm(topic)
	_, err = sc.DeleteBefore(ctx, topic, 0, 8)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		code, lso, recs := fetchAt(topic, 6)
		return code == kerr.OffsetOutOfRange.Code && lso == 8 && len(recs) == 0
	}, 10*time.Second, 10*time.Millisecond, "the log start moved by another instance")

	// Another instance deletes and creates the stream again: the reader stops within
	// its check interval.
	topic = testdb.Name("tailelsewhere")
	warm(topic)
	require.NoError(t, sc.DeleteStream(ctx, topic))
	require.NoError(t, sc.CreateStream(ctx, topic, 1))
	appendN(topic, "new", 12) // past the offsets the reader holds
	require.Eventually(t, func() bool {
		_, _, recs := fetchAt(topic, 5)
		return len(recs) > 0 && string(recs[0].Value) == "new-5"
	}, 10*time.Second, 10*time.Millisecond, "the stream created again by another instance")
}

// TestTailReaderKeepsItsBound: a reader keeps at most its bound of records, the
// latest; a fetch below them reads the log, one within them is answered from memory.
func TestTailReaderKeepsItsBound(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	hub := wakeup.NewHub()
	ts := startServer(t, pool, &Config{Wakeups: hub})
	ts.srv.tails.mu.Lock()
	ts.srv.tails.maxRecords = 5
	ts.srv.tails.mu.Unlock()
	ctx := testCtx(t)
	topic := testdb.Name("tailbound")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 1))
	cl := newClient(t, []string{ts.addr})
	fetchAt := func(off int64) []kgo.Record {
		t.Helper()
		resp, err := fetchReq(topic, 0, off, 0, 1).RequestWith(ctx, cl)
		require.NoError(t, err)
		require.Zero(t, resp.Topics[0].Partitions[0].ErrorCode)
		return recordsOf(t, resp.Topics[0].Partitions[0].RecordBatches)
	}
	fetchAt(0)
	require.Eventually(t, func() bool { return tailHolds(ts, topic, 0, 0) }, 10*time.Second, time.Millisecond)
	var recs []streams.Record
	for i := range 20 {
		recs = append(recs, streams.Record{Bytes: fmt.Appendf(nil, "r-%d", i)})
	}
	_, err := sc.AppendPartition(ctx, topic, 0, recs, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 0)
	require.Eventually(t, func() bool { return tailHolds(ts, topic, 0, 20) }, 10*time.Second, time.Millisecond)
	r := ts.srv.tails.get(partKey{topic, 0})
	r.mu.Lock()
	start, held, bytes := r.start, r.held.len(), r.bytes
	r.mu.Unlock()
	require.Equal(t, int64(15), start)
	require.Equal(t, 5, held)
	require.Equal(t, int64(bytes), ts.srv.tails.bytes.Load(), "the server's total is this reader's")

	read := ts.srv.tails.read.Load()
	got := fetchAt(10)
	require.Equal(t, "r-10", string(got[0].Value))
	require.Equal(t, read+1, ts.srv.tails.read.Load(), "below what the reader holds: from the log")
	got = fetchAt(16)
	require.Len(t, got, 4)
	require.Equal(t, "r-16", string(got[0].Value))
	require.Equal(t, read+1, ts.srv.tails.read.Load(), "from memory")
}

// TestTailReadersStopWithTheServer: a reader no fetch uses stops after its idle
// time, and the server's shutdown stops the others: no reader goroutine is left.
func TestTailReadersStopWithTheServer(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{Wakeups: wakeup.NewHub()})
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	idle, busy := testdb.Name("tailidle"), testdb.Name("tailbusy")
	require.NoError(t, sc.CreateStream(ctx, idle, 1))
	require.NoError(t, sc.CreateStream(ctx, busy, 3))
	cl := newClient(t, []string{ts.addr})

	tailOpts(ts, 100*time.Millisecond, 20*time.Millisecond, nil)
	_, err := fetchReq(idle, 0, 0, 0, 1).RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return tailHolds(ts, idle, 0, 0) }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return ts.srv.tails.get(partKey{idle, 0}) == nil }, 10*time.Second, 5*time.Millisecond,
		"an idle reader stops")

	tailOpts(ts, time.Hour, 0, nil)
	req := fetchReq(busy, 0, 0, 0, 1)
	addFetchPartition(req, 1, 0)
	addFetchPartition(req, 2, 0)
	_, err = req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return ts.srv.tails.count() == 3 }, 10*time.Second, time.Millisecond)
	require.Equal(t, int64(3), ts.srv.tails.running.Load())
	ts.stop()
	require.Zero(t, ts.srv.tails.running.Load(), "reader goroutines left after the server stopped")
	require.Zero(t, ts.srv.tails.count())
}

// tailRowCounter keeps the most rows one statement of the tail readers about one stream
// returned, and counts those statements.
type tailRowCounter struct {
	stream     string
	statements atomic.Int64
	maxRows    atomic.Int64
}

type tailRowCounted struct{}

func (c *tailRowCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if len(d.Args) > 0 && d.Args[0] == c.stream && ctx.Value(tailReadKey{}) != nil {
		return context.WithValue(ctx, tailRowCounted{}, true)
	}
	return ctx
}

func (c *tailRowCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ctx.Value(tailRowCounted{}) == nil || d.Err != nil {
		return
	}
	c.statements.Add(1)
	for n := d.CommandTag.RowsAffected(); ; {
		m := c.maxRows.Load()
		if n <= m || c.maxRows.CompareAndSwap(m, n) {
			return
		}
	}
}

// TestTailReaderReadsOneRowOfAnIdleStream: on an idle stream of 64 partitions, each
// statement of partition 0's reader (its reads, its checks of the stream's identity)
// reads one row, not the heads of every partition: a topic's readers cost each
// second what its partitions do, not their square.
func TestTailReaderReadsOneRowOfAnIdleStream(t *testing.T) {
	t.Parallel()
	topic := testdb.Name("tailrows")
	rc := &tailRowCounter{stream: topic}
	ts := startServer(t, tracedPool(t, rc), &Config{Wakeups: wakeup.NewHub()})
	var reads atomic.Int64
	tailOpts(ts, 0, 10*time.Millisecond, func(string, int32) { reads.Add(1) }) // an identity check every 10 ms
	ctx := testCtx(t)
	sc := streams.NewClient(testdb.Pool(t), nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 64))
	cl := newClient(t, []string{ts.addr})
	_, err := fetchReq(topic, 0, 0, 0, 1).RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return reads.Load() >= 5 }, 10*time.Second, time.Millisecond)
	require.Greater(t, rc.statements.Load(), reads.Load(), "the reader checked the stream's identity")
	require.Equal(t, int64(1), rc.maxRows.Load(), "rows of the reader's largest statement")
}

// TestTailReaderPollsForAWaitingFetch: a record no wake-up announces (the tailer down
// or polling only, a wake-up lost) reaches a fetch waiting on the readers at its
// long poll's safety-net poll (after 5 ms, then 10, 20...), as from the log, not at
// the reader's own poll (an hour here: a second by default).
func TestTailReaderPollsForAWaitingFetch(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	hub := wakeup.NewHub()
	ts := startServer(t, pool, &Config{Wakeups: hub})
	tailOpts(ts, 0, time.Hour, nil)
	ctx := testCtx(t)
	topic := testdb.Name("tailpoll")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 1))
	cl := newClient(t, []string{ts.addr})
	req := fetchReq(topic, 0, 0, 0, 1)
	_, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	// An announced record: the reader has read, and waits.
	_, err = sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: []byte("announced")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 0)
	require.Eventually(t, func() bool { return tailHolds(ts, topic, 0, 1) }, 10*time.Second, time.Millisecond)

	answered := ts.srv.tails.answered.Load()
	req.Topics[0].Partitions[0].FetchOffset = 1
	req.MaxWaitMillis = 5_000
	done := fetchWaiting(t, ctx, ts, cl, req)
	_, err = sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: []byte("unannounced")}}, nil)
	require.NoError(t, err)
	start := time.Now()
	resp := answerOf(t, done, "no answer within 15s")
	recs := recordsOf(t, resp.Topics[0].Partitions[0].RecordBatches)
	require.Len(t, recs, 1, "the record, before max.wait")
	require.Equal(t, "unannounced", string(recs[0].Value))
	require.Less(t, time.Since(start), 3*time.Second)
	require.Equal(t, answered+1, ts.srv.tails.answered.Load(), "answered by the reader")
}

// TestFetchWaitingOnReadersEndsWithItsClient: a client that goes away while its
// fetch long-polls on the tail readers takes the fetch with it: the wait ends at once
// (not at its max.wait), the connection's goroutines end, and the reader, which
// other fetches share, carries on.
func TestFetchWaitingOnReadersEndsWithItsClient(t *testing.T) {
	t.Parallel()
	sn := newTailScene(t, "tailgone")
	ts, ctx, topic := sn.ts, sn.ctx, sn.topic
	gone, err := kgo.NewClient(kgo.SeedBrokers(ts.addr))
	require.NoError(t, err)
	defer gone.Close()
	sn.startReader(t, gone)

	read := ts.srv.tails.read.Load()
	done := fetchWaiting(t, ctx, ts, gone, fetchReq(topic, 0, 0, time.Minute, 1))
	require.Equal(t, read, ts.srv.tails.read.Load(), "the fetch waits on the reader, not on the log")
	gone.Close()
	select {
	case res := <-done:
		require.Error(t, res.err, "the client closed under its fetch")
	case <-ctx.Done():
		t.Fatal("the client's fetch did not end with its Close")
	}
	testdb.WaitFor(t, 10*time.Second, "the waiting fetch ended", func() bool { return ts.srv.fetchesWaiting.Load() == 0 })
	testdb.WaitFor(t, 10*time.Second, "the client's connections ended", func() bool {
		ts.srv.mu.Lock()
		defer ts.srv.mu.Unlock()
		return len(ts.srv.conns) == 0
	})
	require.True(t, tailHolds(ts, topic, 0, 0), "the reader carries on")
}

// TestTailReaderPollsAfterARead: a reader reads again tailPollMin after a read that
// found records, as the native consumer's long poll does, so a commit whose wake-up
// is late or lost is read without waiting for the next wake-up, the reader's check
// or a fetch's poll (none here: its check is an hour, no fetch waits).
func TestTailReaderPollsAfterARead(t *testing.T) {
	t.Parallel()
	sn := newTailScene(t, "tailpollread")
	ts, ctx, topic := sn.ts, sn.ctx, sn.topic
	tailOpts(ts, 0, time.Hour, nil)
	sn.startReader(t, newClient(t, []string{ts.addr}))
	_, err := sn.sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: []byte("announced")}}, nil)
	require.NoError(t, err)
	sn.hub.NotifyPartitions(topic, 0)
	testdb.WaitFor(t, 10*time.Second, "the announced record read", func() bool { return tailHolds(ts, topic, 0, 1) })
	_, err = sn.sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: []byte("unannounced")}}, nil)
	require.NoError(t, err)
	testdb.WaitFor(t, 10*time.Second, "the unannounced record read", func() bool { return tailHolds(ts, topic, 0, 2) })
}

// tailScene is a server with a wake-up hub and a one-partition topic of its own.
type tailScene struct {
	ts    *testServer
	hub   *wakeup.Hub
	ctx   context.Context
	topic string
	sc    *streams.Client
}

func newTailScene(t *testing.T, prefix string) *tailScene {
	t.Helper()
	pool := testdb.Pool(t)
	hub := wakeup.NewHub()
	s := &tailScene{ts: startServer(t, pool, &Config{Wakeups: hub}), hub: hub, ctx: testCtx(t), topic: testdb.Name(prefix), sc: streams.NewClient(pool, nil)}
	require.NoError(t, s.sc.CreateStream(s.ctx, s.topic, 1))
	return s
}

// startReader starts the partition's tail reader with a fetch from offset 0 by cl,
// and waits until it has read.
func (s *tailScene) startReader(t *testing.T, cl *kgo.Client) {
	t.Helper()
	_, err := fetchReq(s.topic, 0, 0, 0, 1).RequestWith(s.ctx, cl)
	require.NoError(t, err)
	testdb.WaitFor(t, 10*time.Second, "the tail reader", func() bool { return tailHolds(s.ts, s.topic, 0, 0) })
}
