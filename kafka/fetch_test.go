package kafka

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

func fetchReq(topic string, partition int32, offset int64, maxWait time.Duration, minBytes int32) *kmsg.FetchRequest {
	req := kmsg.NewPtrFetchRequest()
	req.MaxWaitMillis, req.MinBytes, req.MaxBytes = int32(maxWait/time.Millisecond), minBytes, 1<<20
	req.SessionEpoch = -1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, topicID(topic) // by name up to v12, by id from v13
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = partition, offset, 1<<20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return req
}

// addFetchPartition adds partition of req's first topic to req, from offset, with
// fetchReq's partition max bytes.
func addFetchPartition(req *kmsg.FetchRequest, partition int32, offset int64) {
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = partition, offset, 1<<20
	req.Topics[0].Partitions = append(req.Topics[0].Partitions, rp)
}

// fetchResult is a Fetch's answer, or its error.
type fetchResult struct {
	resp *kmsg.FetchResponse
	err  error
}

// fetchWaiting sends req on cl in a goroutine and returns, with the channel of its
// answer, once the server holds the fetch waiting (its long poll).
func fetchWaiting(t *testing.T, ctx context.Context, ts *testServer, cl *kgo.Client, req *kmsg.FetchRequest) <-chan fetchResult {
	t.Helper()
	waiting := ts.srv.fetchesWaiting.Load()
	done := make(chan fetchResult, 1)
	go func() {
		resp, err := req.RequestWith(ctx, cl)
		done <- fetchResult{resp, err}
	}()
	require.Eventually(t, func() bool { return ts.srv.fetchesWaiting.Load() > waiting }, 10*time.Second, time.Millisecond)
	return done
}

// readGate holds the reads that call wait while armed: each says so on stuck and
// waits for releaseAll, which the test's cleanup calls too (made after startServer,
// it runs before the server stops, which waits for the reads).
type readGate struct {
	armed   atomic.Bool
	stuck   chan struct{}
	release chan struct{}
	once    sync.Once
}

func newReadGate(t *testing.T) *readGate {
	g := &readGate{stuck: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(g.releaseAll)
	return g
}

func (g *readGate) releaseAll() { g.once.Do(func() { close(g.release) }) }

func (g *readGate) wait() {
	if g.armed.Load() {
		g.stuck <- struct{}{}
		<-g.release
	}
}

// answerOf is the answer to a fetch fetchWaiting sent: it fails the test with msg
// when none comes within 15 s, and on the fetch's error.
func answerOf(t *testing.T, done <-chan fetchResult, msg string) *kmsg.FetchResponse {
	t.Helper()
	select {
	case res := <-done:
		require.NoError(t, res.err)
		return res.resp
	case <-time.After(15 * time.Second):
		t.Fatal(msg)
		return nil
	}
}

// A long poll returns as soon as a record is appended (woken by the hub), carries
// the watermarks, and an offset past the log end is OFFSET_OUT_OF_RANGE.
func TestFetchLongPollAndOffsetOutOfRange(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	hub := wakeup.NewHub()
	ts := startServer(t, pool, &Config{Wakeups: hub})
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("poll")
	require.NoError(t, sc.CreateStream(ctx, topic, 1))
	cl := newClient(t, []string{ts.addr})

	type result struct {
		resp *kmsg.FetchResponse
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		resp, err := fetchReq(topic, 0, 0, 20*time.Second, 1).RequestWith(ctx, cl)
		done <- result{resp, err, time.Since(start)}
	}()
	// Append once the fetch waits: its request is counted when it returns, so wait
	// for the server to hold a connection that is inside Fetch instead.
	require.Eventually(t, func() bool { return ts.srv.fetchesWaiting.Load() > 0 }, 10*time.Second, time.Millisecond)
	_, err := sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: []byte("hello")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 0)
	res := <-done
	require.NoError(t, res.err)
	require.Less(t, res.took, 15*time.Second, "the wait ended before max.wait.ms")
	p := res.resp.Topics[0].Partitions[0]
	require.Zero(t, p.ErrorCode)
	require.Equal(t, int64(1), p.HighWatermark)
	require.Equal(t, int64(0), p.LogStartOffset)
	require.NotEmpty(t, p.RecordBatches)

	// Nothing new: the poll waits max.wait.ms, then answers empty.
	start = time.Now()
	resp, err := fetchReq(topic, 0, 1, 300*time.Millisecond, 1).RequestWith(ctx, cl)
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	require.Empty(t, resp.Topics[0].Partitions[0].RecordBatches)

	resp, err = fetchReq(topic, 0, 5, 0, 1).RequestWith(ctx, cl)
	require.NoError(t, err)
	p = resp.Topics[0].Partitions[0]
	require.Equal(t, kerr.OffsetOutOfRange.Code, p.ErrorCode)
	require.Equal(t, int64(1), p.HighWatermark)
	// A topic no stream has, named by id (kgo sends v16): UNKNOWN_TOPIC_ID, at once
	// although max.wait.ms is long.
	start = time.Now()
	resp, err = fetchReq("no-such-topic-y", 0, 0, 20*time.Second, 1).RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Equal(t, kerr.UnknownTopicID.Code, resp.Topics[0].Partitions[0].ErrorCode)
	require.Less(t, time.Since(start), 10*time.Second, "an error ends the long poll")
}

// Shutdown ends a long poll at once (answered, not cut): long before its max wait
// (60s) and the server's ShutdownTimeout (30s), after which it would be cut.
func TestShutdownEndsLongPolls(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{ShutdownTimeout: 30 * time.Second})
	ctx := testCtx(t)
	topic := testdb.Name("shut")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, 1))
	cl := newClient(t, []string{ts.addr}, kgo.RequestRetries(0))
	done := make(chan error, 1)
	go func() {
		resp, err := fetchReq(topic, 0, 0, 60*time.Second, 1).RequestWith(ctx, cl)
		if err == nil && resp.Topics[0].Partitions[0].ErrorCode != 0 {
			err = kerr.ErrorForCode(resp.Topics[0].Partitions[0].ErrorCode)
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return ts.srv.fetchesWaiting.Load() > 0 }, 10*time.Second, time.Millisecond)
	start := time.Now()
	ts.stop()
	require.NoError(t, <-done, "the long poll was answered")
	require.Less(t, time.Since(start), 20*time.Second)
}

// ListOffsets: earliest, latest, by time (offset_for_time), max timestamp.
func TestListOffsets(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("lo")
	require.NoError(t, sc.CreateStream(ctx, topic, 1))
	var times []time.Time
	for range 3 {
		pos, err := sc.AppendPartition(ctx, topic, 0, make([]streams.Record, 2), nil)
		require.NoError(t, err)
		times = append(times, pos.Timestamp)
	}
	_, err := sc.DeleteBefore(ctx, topic, 0, 1)
	require.NoError(t, err)
	adm := newAdmin(t, ts.addr)
	lookup := func(l kadm.ListedOffsets, err error) kadm.ListedOffset {
		require.NoError(t, err)
		o, ok := l.Lookup(topic, 0)
		require.True(t, ok)
		require.NoError(t, o.Err)
		return o
	}
	require.Equal(t, int64(1), lookup(adm.ListStartOffsets(ctx, topic)).Offset)
	require.Equal(t, int64(6), lookup(adm.ListEndOffsets(ctx, topic)).Offset)
	// Log times are at millisecond precision in Kafka; a batch later in the same
	// millisecond shares it.
	at := lookup(adm.ListOffsetsAfterMilli(ctx, times[2].UnixMilli(), topic))
	require.LessOrEqual(t, at.Offset, int64(4))
	require.Equal(t, times[2].UnixMilli(), at.Timestamp)
	after := lookup(adm.ListOffsetsAfterMilli(ctx, times[2].UnixMilli()+1000, topic))
	require.Equal(t, int64(6), after.Offset, "no record that recent: kadm reads Kafka's -1 as the end")
	maxTS := lookup(adm.ListMaxTimestampOffsets(ctx, topic))
	require.Equal(t, int64(5), maxTS.Offset)
}

// An event appended by SQL (and by the Go client) reaches a Kafka consumer with
// the same bytes: JSON data as its JSON text, string headers as headers.
func TestSQLInsertReadByKafkaConsumer(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("interop")
	require.NoError(t, sc.CreateStream(ctx, topic, 1))
	_, err := pool.Exec(ctx, `INSERT INTO streamd.events (stream_name, partition, key, data_bytes, metadata)
		VALUES ($1, 0, 'sql-key', '\x00ff10'::bytea, '{"h":"v"}')`, topic)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO streamd.events (stream_name, partition, data) VALUES ($1, 0, '{"a": [1, 2]}')`, topic)
	require.NoError(t, err)
	_, err = sc.Produce(ctx, streams.Record{Stream: topic, Partition: streams.PartitionOf(0), Key: "go", Data: json.RawMessage(`{"b":true}`)})
	require.NoError(t, err)

	got := consumeN(t, ctx, ts.addr, topic, 3)
	require.Equal(t, []byte{0, 0xff, 0x10}, got[0].Value)
	require.Equal(t, "sql-key", string(got[0].Key))
	require.Equal(t, []kgo.RecordHeader{{Key: "h", Value: []byte("v")}}, got[0].Headers)
	var stored string
	require.NoError(t, pool.QueryRow(ctx, `SELECT data::text FROM streamd.events WHERE stream_name = $1 AND "offset" = 1`, topic).Scan(&stored))
	require.Equal(t, stored, string(got[1].Value), "JSON data is served as its JSON text")
	require.Nil(t, got[1].Key)
	require.JSONEq(t, `{"b":true}`, string(got[2].Value))
	require.Equal(t, int64(2), got[2].Offset)
}

// A record committed while no fetch waits is in the next fetch's answer at once; one
// committed while a fetch waits on a topic of several partitions ends that wait
// through its wake-up: the safety-net poll is an hour away here, so only the wake-up
// can end the wait before max.wait.ms.
func TestFetchSeesCommitsBetweenFetchesAndIsWokenWhileWaiting(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	hub := wakeup.NewHub()
	ts := startServer(t, pool, &Config{Wakeups: hub})
	ts.srv.fetchPoll = &wakeup.PollOpts{MinInterval: time.Hour, MaxInterval: time.Hour}
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("wake")
	require.NoError(t, sc.CreateStream(ctx, topic, 3))
	cl := newClient(t, []string{ts.addr})
	fetch := func(offsets ...int64) *kmsg.FetchRequest {
		req := fetchReq(topic, 0, offsets[0], 30*time.Second, 1)
		for p := 1; p < len(offsets); p++ {
			addFetchPartition(req, int32(p), offsets[p])
		}
		return req
	}

	// Between fetches: appended and notified while nobody waits.
	_, err := sc.AppendPartition(ctx, topic, 2, []streams.Record{{Bytes: []byte("between")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 2)
	start := time.Now()
	resp, err := fetch(0, 0, 0).RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Less(t, time.Since(start), 10*time.Second, "the first read of a fetch finds what was committed before it")
	ps := resp.Topics[0].Partitions
	require.Empty(t, ps[0].RecordBatches)
	require.Empty(t, ps[1].RecordBatches)
	require.NotEmpty(t, ps[2].RecordBatches)
	require.Equal(t, []int64{0, 0, 1}, []int64{ps[0].HighWatermark, ps[1].HighWatermark, ps[2].HighWatermark})

	// While a fetch waits on all three partitions at their log ends.
	type result struct {
		resp *kmsg.FetchResponse
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	start = time.Now()
	go func() {
		resp, err := fetch(0, 0, 1).RequestWith(ctx, cl)
		done <- result{resp, err, time.Since(start)}
	}()
	require.Eventually(t, func() bool { return ts.srv.fetchesWaiting.Load() > 0 }, 10*time.Second, time.Millisecond)
	_, err = sc.AppendPartition(ctx, topic, 1, []streams.Record{{Bytes: []byte("woken")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 1)
	res := <-done
	require.NoError(t, res.err)
	require.Less(t, res.took, 20*time.Second, "the wake-up ended the wait, long before max.wait.ms (30s) and the poll (1h)")
	ps = res.resp.Topics[0].Partitions
	require.Empty(t, ps[0].RecordBatches)
	require.NotEmpty(t, ps[1].RecordBatches)
	require.Empty(t, ps[2].RecordBatches)
	require.Equal(t, []int64{0, 1, 1}, []int64{ps[0].HighWatermark, ps[1].HighWatermark, ps[2].HighWatermark})
}

// statementLog records the statements a pool runs whose first argument is stream.
type statementLog struct {
	stream string
	mu     sync.Mutex
	sqls   []string
	parts  []any // the second argument (a partition for the fetch read)
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if len(d.Args) > 0 && d.Args[0] == l.stream {
		l.mu.Lock()
		var p any
		if len(d.Args) > 1 {
			p = d.Args[1]
		}
		l.sqls, l.parts = append(l.sqls, d.SQL), append(l.parts, p)
		l.mu.Unlock()
	}
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *statementLog) take() (sqls []string, parts []any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sqls, parts = l.sqls, l.parts
	l.sqls, l.parts = nil, nil
	return sqls, parts
}

// TestWokenFetchReadsOnlyTheWokenPartition: a long poll over four partitions, woken
// for one of them, reads that partition's events directly, in one statement: no
// head-row read before it, no read of the other partitions (whose answers stand);
// a wake-up for a partition the commit did not touch still finds the commit at the
// safety-net poll, which reads everything.
func TestWokenFetchReadsOnlyTheWokenPartition(t *testing.T) {
	t.Parallel()
	topic := testdb.Name("woken")
	log := &statementLog{stream: topic}
	pool := tracedPool(t, log)
	hub := wakeup.NewHub()
	ts := startServer(t, pool, &Config{Wakeups: hub})
	// The fetches' own reads: the readers the first answer starts read all four
	// partitions into the log, at times (1 run in 20 under -race), and answer the
	// second fetch from memory (tail_test.go).
	tailsOff(ts)
	// The safety-net poll: long enough not to come before the first wake-up.
	ts.srv.fetchPoll = &wakeup.PollOpts{MinInterval: 3 * time.Second, MaxInterval: 3 * time.Second}
	ctx := testCtx(t)
	sc := streams.NewClient(testdb.Pool(t), nil) // its statements are not logged
	require.NoError(t, sc.CreateStream(ctx, topic, 4))
	cl := newClient(t, []string{ts.addr})
	req := fetchReq(topic, 0, 0, 30*time.Second, 1)
	for p := int32(1); p < 4; p++ {
		addFetchPartition(req, p, 0)
	}
	type result struct {
		resp *kmsg.FetchResponse
		err  error
	}
	wait := func() <-chan result {
		done := make(chan result, 1)
		waiting := ts.srv.fetchesWaiting.Load()
		go func() {
			resp, err := req.RequestWith(ctx, cl)
			done <- result{resp, err}
		}()
		require.Eventually(t, func() bool { return ts.srv.fetchesWaiting.Load() > waiting }, 10*time.Second, time.Millisecond)
		return done
	}

	done := wait()
	log.take() // the first pass
	_, err := sc.AppendPartition(ctx, topic, 2, []streams.Record{{Bytes: []byte("woken")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 2)
	res := <-done
	require.NoError(t, res.err)
	ps := res.resp.Topics[0].Partitions
	require.NotEmpty(t, ps[2].RecordBatches)
	require.Equal(t, []int64{0, 0, 1, 0}, []int64{ps[0].HighWatermark, ps[1].HighWatermark, ps[2].HighWatermark, ps[3].HighWatermark})
	sqls, parts := log.take()
	var reads []any
	for i, q := range sqls {
		require.NotContains(t, q, "stream_partitions WHERE stream_name = $1 ORDER BY partition", "no head-row read after the wake-up")
		if strings.Contains(q, "FROM streamd.events") {
			reads = append(reads, parts[i])
		}
	}
	require.Equal(t, []any{int32(2)}, reads, "one read, of the woken partition (statements: %q)", sqls)

	// A wake-up that names the wrong partition: the commit is found by the safety net.
	req.Topics[0].Partitions[2].FetchOffset = 1
	done = wait()
	_, err = sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: []byte("unannounced")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 3)
	res = <-done
	require.NoError(t, res.err)
	ps = res.resp.Topics[0].Partitions
	require.NotEmpty(t, ps[0].RecordBatches, "found by the poll after the wake-up's pass")
	require.Equal(t, []int64{1, 0, 1, 0}, []int64{ps[0].HighWatermark, ps[1].HighWatermark, ps[2].HighWatermark, ps[3].HighWatermark})
}

// TestSlowReadDoesNotHoldUpAnotherPartition: one fetch long-polls two partitions (as
// a Kafka client does with one broker). A record of partition 1, woken while the
// read of partition 0 is stuck, is answered at once, without waiting for that read;
// the stuck read, once done, answers the connection's next fetch of partition 0
// without reading again.
func TestSlowReadDoesNotHoldUpAnotherPartition(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	hub := wakeup.NewHub()
	ts := startServer(t, pool, &Config{Wakeups: hub})
	ts.srv.fetchPoll = &wakeup.PollOpts{MinInterval: 20 * time.Second, MaxInterval: 20 * time.Second} // wake-ups only
	topic := testdb.Name("slowread")
	g := newReadGate(t) // after startServer: released before the server stops, which waits for the reads
	blocking, stuck, releaseAll := &g.armed, g.stuck, g.releaseAll
	var reads0 atomic.Int32
	ts.srv.fetchReadHook = func(tp string, p int32) {
		if tp != topic || p != 0 {
			return
		}
		reads0.Add(1)
		g.wait()
	}
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 2))
	cl := newClient(t, []string{ts.addr})
	req := fetchReq(topic, 0, 0, 30*time.Second, 1)
	addFetchPartition(req, 1, 0)
	type result struct {
		resp *kmsg.FetchResponse
		err  error
	}
	fetch := func() <-chan result {
		done := make(chan result, 1)
		go func() {
			resp, err := req.RequestWith(ctx, cl)
			done <- result{resp, err}
		}()
		return done
	}
	answer := func(done <-chan result, what string) []kmsg.FetchResponseTopicPartition {
		t.Helper()
		select {
		case res := <-done:
			require.NoError(t, res.err)
			return res.resp.Topics[0].Partitions
		case <-time.After(15 * time.Second):
			t.Fatalf("no answer within 15s: %s", what)
			return nil
		}
	}

	waiting := ts.srv.fetchesWaiting.Load()
	done := fetch()
	require.Eventually(t, func() bool { return ts.srv.fetchesWaiting.Load() > waiting }, 10*time.Second, time.Millisecond)
	blocking.Store(true)
	_, err := sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: []byte("slow")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 0)
	waitStuck(t, stuck) // partition 0's read is under way, and stays
	blocking.Store(false)
	_, err = sc.AppendPartition(ctx, topic, 1, []streams.Record{{Bytes: []byte("fast")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 1)
	ps := answer(done, "partition 1's record waits for partition 0's read")
	require.NotEmpty(t, ps[1].RecordBatches, "partition 1's record")
	require.Empty(t, ps[0].RecordBatches, "partition 0's read is still under way")
	require.Equal(t, int64(1), ps[0].HighWatermark, "the log end, not the offset asked for (a client would take it for the end)")

	releaseAll()
	req.Topics[0].Partitions[1].FetchOffset = 1
	before := reads0.Load()
	ps = answer(fetch(), "the next fetch")
	require.NotEmpty(t, ps[0].RecordBatches, "the stuck read's record")
	require.Equal(t, int64(1), ps[0].HighWatermark)
	require.Equal(t, before, reads0.Load(), "from the read the first fetch left, not a new one")
}

// TestReadEndingBeforeTheHeadsJoinsTheAnswer: a pass that holds min.bytes while
// another partition's read is under way reads the head rows for that partition's
// watermarks; a read that ends meanwhile joins the answer instead of waiting in the
// stash for the client's next fetch.
func TestReadEndingBeforeTheHeadsJoinsTheAnswer(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	hub := wakeup.NewHub()
	ts := startServer(t, pool, &Config{Wakeups: hub})
	ts.srv.fetchPoll = &wakeup.PollOpts{MinInterval: 20 * time.Second, MaxInterval: 20 * time.Second} // wake-ups only
	topic := testdb.Name("headsrace")
	var blocking atomic.Bool
	stuck, release := make(chan struct{}, 1), make(chan struct{})
	headsStarted, headsRelease := make(chan struct{}, 1), make(chan struct{})
	var releaseOnce, headsOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(func() { headsOnce.Do(func() { close(headsRelease) }); releaseAll() }) // before the server stops
	ts.srv.fetchReadHook = func(tp string, p int32) {
		if tp == topic && p == 0 && blocking.Load() {
			stuck <- struct{}{}
			<-release
		}
	}
	ts.srv.fetchHeadsHook = func() {
		select {
		case headsStarted <- struct{}{}:
		default:
		}
		<-headsRelease
	}
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 2))
	cl := newClient(t, []string{ts.addr})
	req := fetchReq(topic, 0, 0, 30*time.Second, 1)
	addFetchPartition(req, 1, 0)
	done := fetchWaiting(t, ctx, ts, cl, req)
	blocking.Store(true)
	_, err := sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: []byte("slow")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 0)
	waitStuck(t, stuck) // partition 0's read is under way
	blocking.Store(false)
	_, err = sc.AppendPartition(ctx, topic, 1, []streams.Record{{Bytes: []byte("fast")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 1)
	var res fetchResult
	select {
	case <-headsStarted: // partition 1's records are in; the pass reads the heads
		releaseAll() // partition 0's read ends before the head read does
		select {
		case res = <-done:
		case <-time.After(15 * time.Second):
			t.Fatal("no answer within 15s of partition 0's read ending")
		}
	case res = <-done: // answered without reading the heads in parallel
	case <-time.After(15 * time.Second):
		t.Fatal("neither an answer nor a head read within 15s")
	}
	require.NoError(t, res.err)
	ps := res.resp.Topics[0].Partitions
	require.NotEmpty(t, ps[1].RecordBatches, "partition 1's record")
	require.NotEmpty(t, ps[0].RecordBatches, "partition 0's read ended before the head read: its record is in the answer")
	require.Equal(t, int64(1), ps[0].HighWatermark)
}

// waitStuck waits for a read to signal on stuck.
func waitStuck(t *testing.T, stuck <-chan struct{}) {
	t.Helper()
	select {
	case <-stuck:
	case <-time.After(15 * time.Second):
		t.Fatal("no read got stuck within 15s")
	}
}

// stashDone reports whether a connection of ts has a read of topic/partition in its
// stash that has ended.
func stashDone(ts *testServer, topic string, partition int32) bool {
	ts.srv.mu.Lock()
	defer ts.srv.mu.Unlock()
	for c := range ts.srv.conns {
		c.stash.mu.Lock()
		sr := c.stash.reads[partKey{topic, partition}]
		c.stash.mu.Unlock()
		if sr != nil {
			select {
			case <-sr.done:
				return true
			default:
			}
		}
	}
	return false
}

// TestLeftReadsKeepFetchMaxBytes: a fetch of many partitions answers while reads
// are under way; the next fetch, which waits for them all, still holds no more
// record bytes than its fetch.max.bytes. Only the reads that had one of the
// connection's slots are left running (the others are dropped, not read into the
// stash with the whole byte bound each), and a left read joins the next fetch only
// if it fits.
func TestLeftReadsKeepFetchMaxBytes(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	hub := wakeup.NewHub()
	ts := startServer(t, pool, &Config{Wakeups: hub})
	ts.srv.fetchPoll = &wakeup.PollOpts{MinInterval: 20 * time.Second, MaxInterval: 20 * time.Second} // wake-ups only
	topic := testdb.Name("maxbytes")
	const partitions, recordBytes, maxBytes = 12, 100 << 10, 300 << 10
	// The first reads block (holding their slots) until released: the fetch is answered
	// by a later one, with these and those waiting for a slot under way.
	stuck, release := make(chan struct{}, fetchParallelism), make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseAll)
	var entered atomic.Int32
	ts.srv.fetchReadHook = func(tp string, p int32) {
		if tp == topic && entered.Add(1) < fetchParallelism {
			stuck <- struct{}{}
			<-release
		}
	}
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, partitions))
	payload := make([]byte, recordBytes)
	for i := range payload {
		payload[i] = byte(i*7919 + i>>8) // not compressible much, whatever the topic's codec
	}
	cl := newClient(t, []string{ts.addr})
	req := fetchReq(topic, 0, 0, 30*time.Second, 1)
	req.MaxBytes = maxBytes
	all := []int32{0}
	for p := int32(1); p < partitions; p++ {
		addFetchPartition(req, p, 0)
		all = append(all, p)
	}
	sum := func(ps []kmsg.FetchResponseTopicPartition) int {
		n := 0
		for _, p := range ps {
			require.Zero(t, p.ErrorCode, "partition %d", p.Partition)
			n += len(p.RecordBatches)
		}
		return n
	}

	// The fetch waits (the first pass's one statement found nothing); the records come,
	// and its pass after the wake-up reads the partitions one by one.
	done := fetchWaiting(t, ctx, ts, cl, req)
	for p := int32(0); p < partitions; p++ {
		_, err := sc.AppendPartition(ctx, topic, p, []streams.Record{{Bytes: payload}}, nil)
		require.NoError(t, err)
	}
	hub.NotifyPartitions(topic, all...)
	res := <-done
	require.NoError(t, res.err)
	ps := res.resp.Topics[0].Partitions
	require.NotZero(t, sum(ps))
	for i := 0; i < fetchParallelism-1; i++ {
		waitStuck(t, stuck)
	}
	for i, p := range ps {
		require.Equal(t, int64(1), p.HighWatermark, "partition %d: the log end, read or not", p.Partition)
		if len(p.RecordBatches) > 0 {
			req.Topics[0].Partitions[i].FetchOffset = 1
		}
	}

	// The next fetch waits for every read (min.bytes past what fits, a short wait).
	releaseAll()
	req.MinBytes, req.MaxWaitMillis = 1<<30, 500
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	ps = resp.Topics[0].Partitions
	require.LessOrEqual(t, sum(ps), maxBytes, "record bytes of the next fetch")
	for _, p := range ps {
		require.Equal(t, int64(1), p.HighWatermark, "partition %d", p.Partition)
	}
}

// TestStashedReadChecksTheLogStart: a read a fetch left running, done before the
// connection's next fetch, is not used when the records it read were deleted since
// (DeleteRecords moved the log start past its offset): the next fetch of that
// offset is OFFSET_OUT_OF_RANGE, as a read of the partition then says.
func TestStashedReadChecksTheLogStart(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	hub := wakeup.NewHub()
	ts := startServer(t, pool, &Config{Wakeups: hub})
	// The stash's check; a tail reader sees the library's DeleteBefore within its
	// check interval (tail_test.go).
	tailsOff(ts)
	ts.srv.fetchPoll = &wakeup.PollOpts{MinInterval: 20 * time.Second, MaxInterval: 20 * time.Second} // wake-ups only
	topic := testdb.Name("stashstart")
	var blocking atomic.Bool
	blocking.Store(true)
	stuck, release := make(chan struct{}, 1), make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseAll)
	ts.srv.fetchReadHook = func(tp string, p int32) {
		if tp == topic && p == 0 && blocking.CompareAndSwap(true, false) {
			stuck <- struct{}{}
			<-release
		}
	}
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 2))
	cl := newClient(t, []string{ts.addr})
	req := fetchReq(topic, 0, 0, 30*time.Second, 1)
	addFetchPartition(req, 1, 0)
	done := fetchWaiting(t, ctx, ts, cl, req)
	_, err := sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: []byte("a")}, {Bytes: []byte("b")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 0)
	waitStuck(t, stuck) // partition 0's read (after the wake-up) is under way, and stays
	_, err = sc.AppendPartition(ctx, topic, 1, []streams.Record{{Bytes: []byte("c")}}, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 1)
	resp := answerOf(t, done, "no answer within 15s")
	ps := resp.Topics[0].Partitions
	require.NotEmpty(t, ps[1].RecordBatches)
	require.Empty(t, ps[0].RecordBatches, "partition 0's read is under way")
	require.Equal(t, []int64{2, 0}, []int64{ps[0].HighWatermark, ps[0].LogStartOffset}, "partition 0's head row")

	releaseAll()
	require.Eventually(t, func() bool { return stashDone(ts, topic, 0) }, 15*time.Second, time.Millisecond, "the left read ends")
	_, err = sc.DeleteBefore(ctx, topic, 0, 2)
	require.NoError(t, err)
	req.Topics[0].Partitions[1].FetchOffset = 1
	req.MaxWaitMillis = 0
	resp, err = req.RequestWith(ctx, cl)
	require.NoError(t, err)
	ps = resp.Topics[0].Partitions
	require.Equal(t, kerr.OffsetOutOfRange.Code, ps[0].ErrorCode, "not the deleted records the left read holds")
	require.Empty(t, ps[0].RecordBatches)
	require.Equal(t, int64(2), ps[0].LogStartOffset)
}

// TestStashTakeChecks: take uses a stashed read only at the offset asked for, less
// than fetchStashMaxAge after it went into the stash, within the partition's log by
// its head row, and not from a log that had more than the current one (the stream
// deleted and created again); the reads it does not use are cancelled.
func TestStashTakeChecks(t *testing.T) {
	t.Parallel()
	now := time.Now()
	topic := "t"
	heads := map[string][]streams.PartitionInfo{topic: {{Partition: 0, LogStartOffset: 2, NextOffset: 10}}}
	job := func(offset int64) fetchJob {
		p := kmsg.NewFetchRequestTopicPartition()
		p.FetchOffset = offset
		return fetchJob{topic: topic, partition: p}
	}
	ended := func(offset, hwm int64, at time.Time) *stashedRead {
		ctx, cancel := context.WithCancel(context.Background())
		sr := &stashedRead{offset: offset, ctx: ctx, cancel: cancel, done: make(chan struct{}), started: true, at: at, n: 1}
		sr.rp.HighWatermark, sr.rp.RecordBatches = hwm, []byte{0}
		close(sr.done)
		return sr
	}
	for _, tc := range []struct {
		name   string
		sr     *stashedRead
		offset int64
		heads  map[string][]streams.PartitionInfo
		use    bool
	}{
		{"fresh", ended(5, 8, now), 5, heads, true},
		{"another offset", ended(5, 8, now), 6, heads, false},
		{"too old", ended(5, 8, now.Add(-2*fetchStashMaxAge)), 5, heads, false},
		{"below the log start", ended(1, 8, now), 1, heads, false},
		{"past the log end", ended(11, 12, now), 11, heads, false},
		{"a longer log than now", ended(5, 12, now), 5, heads, false},
		{"no head row", ended(5, 8, now), 5, nil, false},
	} {
		st := &fetchStash{reads: map[partKey]*stashedRead{{topic, 0}: tc.sr}}
		stashed, rest := st.take([]fetchJob{job(tc.offset)}, tc.heads, now)
		require.Equal(t, tc.use, len(stashed) == 1, tc.name)
		require.Equal(t, !tc.use, len(rest) == 1, tc.name)
		require.Equal(t, !tc.use, tc.sr.ctx.Err() != nil, "%s: cancelled when not used", tc.name)
		if tc.use {
			require.Equal(t, []int64{10, 10, 2}, []int64{tc.sr.rp.HighWatermark, tc.sr.rp.LastStableOffset, tc.sr.rp.LogStartOffset},
				"watermarks from the head row")
		}
		require.Empty(t, st.reads, tc.name)
	}
}

// tracedPool returns a pool of the test database whose connections report their
// statements to tracer (closed when the test ends).
func tracedPool(t *testing.T, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg := testdb.Config(t)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
