package tailer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/tailer"
	"github.com/streamd/streamd/internal/tailer/tailertest"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/internal/testmetrics"
	"github.com/streamd/streamd/streams"
)

// recorder collects what a tailer hands on, for the targets of one test (the tailer
// sees every commit in the shared database).
type recorder struct {
	mu     sync.Mutex
	names  map[string]bool
	events []tailer.Event
	alls   int
	gate   chan struct{} // when set, the handler waits on it for events of ours
	inGate chan tailer.Event
}

func newRecorder(names ...string) *recorder {
	r := &recorder{names: map[string]bool{}}
	for _, n := range names {
		r.names[n] = true
	}
	return r
}

func (r *recorder) handle(ctx context.Context, ev tailer.Event) {
	r.mu.Lock()
	if ev.All {
		r.alls++
		r.mu.Unlock()
		return
	}
	ours := false
	for _, tg := range ev.Targets {
		if r.names[tg.Name] {
			ours = true
		}
	}
	if ours {
		r.events = append(r.events, ev)
	}
	gate, inGate := r.gate, r.inGate
	r.mu.Unlock()
	if ours && gate != nil {
		inGate <- ev
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
}

// targets returns every target of ours seen so far.
func (r *recorder) targets() map[tailer.Target]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[tailer.Target]int{}
	for _, ev := range r.events {
		for _, tg := range ev.Targets {
			if r.names[tg.Name] {
				out[tg]++
			}
		}
	}
	return out
}

func (r *recorder) allCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.alls
}

// testPool returns a pool on the package's private cluster, closed when the test ends.
func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), tailertest.Shared(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// startTailer runs a tailer on url until the test ends.
func startTailer(t *testing.T, url string, rec *recorder, mod func(*tailer.Config)) *tailer.Tailer {
	t.Helper()
	cfg := &tailer.Config{
		ApplicationName: testdb.Name("tailer-test"),
		ConnString:      url,
		Handler:         rec.handle,
		MinBackoff:      20 * time.Millisecond,
		MaxBackoff:      200 * time.Millisecond,
		StatusInterval:  100 * time.Millisecond,
	}
	if mod != nil {
		mod(cfg)
	}
	tl, err := tailer.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tl.Run(ctx) }() // owner: the test; exits at cleanup (cancel)
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "Run returns nil after ctx ends")
		case <-time.After(10 * time.Second):
			t.Error("tailer did not stop within 10s of cancel")
		}
	})
	testdb.WaitFor(t, 90*time.Second, "tailer streaming", func() bool { return tl.State() == tailer.StateStreaming })
	return tl
}

func createStream(t *testing.T, pool *pgxpool.Pool, partitions int32) string {
	t.Helper()
	name := testdb.Name("tail")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(context.Background(), name, partitions))
	return name
}

// insertMessage creates queue when it is missing (a plain INSERT into an unknown
// queue is refused) and inserts a message into it by plain SQL.
func insertMessage(t *testing.T, pool *pgxpool.Pool, queue string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO streamd.queues (queue_name) VALUES ($1) ON CONFLICT DO NOTHING`, queue)
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(),
		`INSERT INTO streamd.messages (stream_name, message_id, data) VALUES ($1, gen_random_uuid()::text, '{}')`, queue)
	require.NoError(t, err)
}

// TestWakeupsForEveryPartitionAndQueue: a commit on any partition of a stream, and a
// message sent to any queue, reaches the handler with its (stream, partition) or queue
// name; one transaction over several partitions is one event naming each once; a
// rolled-back transaction wakes nobody.
func TestWakeupsForEveryPartitionAndQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testPool(t)
	const parts = 8
	stream := createStream(t, pool, parts)
	rolledBack := createStream(t, pool, 1)
	queues := []string{testdb.Name("tq"), testdb.Name("tq"), testdb.Name("tq")}
	rec := newRecorder(append([]string{stream, rolledBack}, queues...)...)
	reg := prometheus.NewRegistry()
	startTailer(t, tailertest.Shared(t), rec, func(c *tailer.Config) { c.Registerer = reg })
	require.Equal(t, 1.0, testmetrics.Value(t, reg, "streamd_tailer_connected"))

	c := streams.NewClient(pool, nil)
	// The rolled-back transaction goes first: when later commits have been seen, it
	// would have been seen too.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = streams.ProduceTx(ctx, tx, streams.Record{Stream: rolledBack, Data: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	for p := int32(0); p < parts; p++ {
		_, err := c.Produce(ctx, streams.Record{Stream: stream, Partition: streams.PartitionOf(p), Data: []byte(`{"p":1}`)})
		require.NoError(t, err)
	}
	for _, q := range queues {
		insertMessage(t, pool, q)
	}
	// One transaction, three partitions, two records in partition 1.
	multi := []streams.Record{
		{Stream: stream, Partition: streams.PartitionOf(1), Data: []byte(`{}`)},
		{Stream: stream, Partition: streams.PartitionOf(5), Data: []byte(`{}`)},
		{Stream: stream, Partition: streams.PartitionOf(1), Data: []byte(`{}`)},
		{Stream: stream, Partition: streams.PartitionOf(7), Data: []byte(`{}`)},
	}
	_, err = c.Produce(ctx, multi...)
	require.NoError(t, err)

	want := map[tailer.Target]int{}
	for p := int32(0); p < parts; p++ {
		want[tailer.Target{Kind: tailer.KindStream, Name: stream, Partition: p}] = 1
	}
	for _, p := range []int32{1, 5, 7} {
		want[tailer.Target{Kind: tailer.KindStream, Name: stream, Partition: p}]++
	}
	for _, q := range queues {
		want[tailer.Target{Kind: tailer.KindQueue, Name: q}] = 1
	}
	testdb.WaitFor(t, 20*time.Second, "every partition and queue", func() bool { return len(rec.targets()) == len(want) && sum(rec.targets()) == sum(want) })
	require.Equal(t, want, rec.targets(), "each commit's targets once, nothing for the rolled-back stream")

	rec.mu.Lock()
	last := rec.events[len(rec.events)-1]
	rec.mu.Unlock()
	require.Equal(t, []tailer.Target{
		{Kind: tailer.KindStream, Name: stream, Partition: 1},
		{Kind: tailer.KindStream, Name: stream, Partition: 5},
		{Kind: tailer.KindStream, Name: stream, Partition: 7},
	}, last.Targets, "one event per transaction, each target once")
	require.NotZero(t, last.EndLSN)
	require.WithinDuration(t, time.Now(), last.CommitTime, time.Minute)

	// The metrics saw them: transactions handed on, their delay, the lag gauge.
	mfs, err := reg.Gather()
	require.NoError(t, err)
	byName := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		switch {
		case m.Counter != nil:
			byName[mf.GetName()] = m.Counter.GetValue()
		case m.Histogram != nil:
			byName[mf.GetName()] = float64(m.Histogram.GetSampleCount())
		case m.Gauge != nil:
			byName[mf.GetName()] = m.Gauge.GetValue()
		}
	}
	require.GreaterOrEqual(t, byName["streamd_tailer_transactions_total"], float64(parts+len(queues)+1))
	require.GreaterOrEqual(t, byName["streamd_tailer_delay_seconds"], float64(parts+len(queues)+1))
	require.Contains(t, byName, "streamd_tailer_lag_bytes")
}

func sum(m map[tailer.Target]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// slotOf returns the name and confirmed_flush_lsn of the slot of the tailer with
// the given application name ("" when it has none).
func slotOf(t *testing.T, pool *pgxpool.Pool, app string) (name string, temporary bool, confirmed uint64) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `
		SELECT s.slot_name, s.temporary, (s.confirmed_flush_lsn - '0/0'::pg_lsn)::bigint
		  FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
		 WHERE r.application_name = $1`, app).Scan(&name, &temporary, &confirmed)
	if err != nil && err.Error() != "no rows in result set" {
		require.NoError(t, err)
	}
	return name, temporary, confirmed
}

// TestConfirmsOnlyHandledPositions: while the handler has not returned for a
// transaction, the slot's confirmed position stays before that transaction's end,
// whatever status updates are due; after it returns, the position is confirmed on
// the next status update (the slot does not pin WAL).
func TestConfirmsOnlyHandledPositions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testPool(t)
	stream := createStream(t, pool, 1)
	rec := newRecorder(stream)
	rec.gate = make(chan struct{})
	rec.inGate = make(chan tailer.Event, 1)
	app := testdb.Name("tailer-confirm")
	startTailer(t, tailertest.Shared(t), rec, func(c *tailer.Config) { c.ApplicationName = app; c.StatusInterval = 20 * time.Millisecond })

	slot, temporary, _ := slotOf(t, pool, app)
	require.NotEmpty(t, slot)
	require.True(t, temporary, "the tailer's slot is temporary")

	_, err := streams.NewClient(pool, nil).Produce(ctx, streams.Record{Stream: stream, Data: []byte(`{}`)})
	require.NoError(t, err)
	var ev tailer.Event
	select {
	case ev = <-rec.inGate:
	case <-time.After(20 * time.Second):
		t.Fatal("no event for the commit")
	}
	// The handler is blocked: for many status intervals, nothing at or past the
	// transaction's end may be confirmed.
	until := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(until) {
		_, _, confirmed := slotOf(t, pool, app)
		require.Less(t, confirmed, ev.EndLSN, "confirmed a transaction the handler has not returned for")
		time.Sleep(10 * time.Millisecond) // sampling interval over a fixed window
	}
	close(rec.gate)
	testdb.WaitFor(t, 10*time.Second, fmt.Sprintf("confirmed_flush_lsn >= %d", ev.EndLSN), func() bool {
		_, _, confirmed := slotOf(t, pool, app)
		return confirmed >= ev.EndLSN
	})
}

// TestIdleTailerDoesNotPinWAL: WAL written for tables outside the publication is
// confirmed too (the keepalive after it says nothing of ours precedes it), so a
// long-lived tailer on a quiet stream does not make the server keep WAL.
func TestIdleTailerDoesNotPinWAL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testPool(t)
	app := testdb.Name("tailer-idle")
	startTailer(t, tailertest.Shared(t), newRecorder(), func(c *tailer.Config) { c.ApplicationName = app; c.StatusInterval = 20 * time.Millisecond })
	table := pgx.Identifier{strings.ReplaceAll(testdb.Name("other"), "-", "_")}.Sanitize()
	_, err := pool.Exec(ctx, "CREATE TABLE "+table+" (v int)")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO "+table+" SELECT generate_series(1, 10000)")
	require.NoError(t, err)
	var after uint64
	require.NoError(t, pool.QueryRow(ctx, "SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint").Scan(&after))
	testdb.WaitFor(t, 30*time.Second, "confirmed past the other table's WAL", func() bool {
		_, _, confirmed := slotOf(t, pool, app)
		return confirmed >= after
	})
}

// TestLagBytesSeesABacklog: streamd_tailer_lag_bytes (which the docs say to alert on)
// grows when the handler falls behind a burst of commits, and comes down when it has
// caught up. It used to be computed from the replication messages' positions, which a
// logical walsender sets to what it sent: the gauge stayed near 0 behind megabytes of
// WAL.
func TestLagBytesSeesABacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testPool(t)
	stream := createStream(t, pool, 1)
	reg := prometheus.NewRegistry()
	startTailer(t, tailertest.Shared(t), newRecorder(stream), func(c *tailer.Config) {
		c.Registerer = reg
		c.StatusInterval = 50 * time.Millisecond
		inner := c.Handler
		c.Handler = func(ctx context.Context, ev tailer.Event) {
			inner(ctx, ev)
			if !ev.All {
				time.Sleep(20 * time.Millisecond) // a slow handler: 50 commits a second
			}
		}
	})
	// 150 commits of about 19 kB of incompressible data, written faster than the
	// handler takes them: megabytes of WAL behind it.
	for range 150 {
		_, err := pool.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_type, data)
			VALUES ($1, 't', jsonb_build_object('p', (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 600))))`, stream)
		require.NoError(t, err)
	}
	testdb.WaitFor(t, 10*time.Second, "the lag gauge to see the backlog", func() bool {
		return testmetrics.Value(t, reg, "streamd_tailer_lag_bytes") > 5e5
	})
	testdb.WaitFor(t, 20*time.Second, "the lag gauge to come down", func() bool {
		return testmetrics.Value(t, reg, "streamd_tailer_lag_bytes") < 1e5
	})
}
