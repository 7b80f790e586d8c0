package retention_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/internal/testmetrics"
	"github.com/streamd/streamd/retention"
	"github.com/streamd/streamd/streams"
)

// The seed's apply_time_retention deletes exactly the events older than the age (a
// prefix), moves the log start, and a fetch below it is out of range.
func TestApplyTimeRetentionDeletesExactlyTheOlderPrefix(t *testing.T) {
	t.Parallel()
	f := setup(t, 2)
	now := time.Now()
	var ts []time.Time
	for i := 10; i >= 1; i-- { // 10 days old .. 1 day old
		ts = append(ts, now.Add(-time.Duration(i)*24*time.Hour))
	}
	f.backdate(0, ts)
	f.produce(0, 3) // fresh: offsets 10..12
	f.backdate(1, ts[:2])

	var n int
	// Older than 5.5 days: the 10, 9, 8, 7 and 6 day old events of partition 0, both of partition 1.
	require.NoError(t, f.pool.QueryRow(f.ctx, "SELECT streamd.apply_time_retention($1, $2)", f.stream, int((5*24+12)*3600)).Scan(&n))
	require.Equal(t, 7, n)
	require.Equal(t, seq(5, 13), f.stored(0))
	require.Empty(t, f.stored(1))
	start, end := f.head(0)
	require.Equal(t, [2]int64{5, 13}, [2]int64{start, end})
	start, end = f.head(1)
	require.Equal(t, [2]int64{2, 2}, [2]int64{start, end}, "a partition emptied by retention starts at its log end")

	_, err := f.client.Fetch(f.ctx, f.stream, 0, 4, nil)
	var oor *streams.OffsetOutOfRangeError
	require.ErrorAs(t, err, &oor)
	require.Equal(t, int64(5), oor.LogStartOffset)
	res, err := f.client.Fetch(f.ctx, f.stream, 0, 5, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, 8)

	// Boundary: an age just above the oldest remaining event deletes nothing.
	require.NoError(t, f.pool.QueryRow(f.ctx, "SELECT streamd.apply_time_retention($1, $2)", f.stream, 5*24*3600+3600).Scan(&n))
	require.Equal(t, 0, n)
	require.Equal(t, seq(5, 13), f.stored(0))
}

// apply_size_retention keeps exactly max_event_count per partition (the seed kept one
// more), at every boundary.
func TestApplySizeRetentionKeepsExactlyN(t *testing.T) {
	t.Parallel()
	f := setup(t, 3)
	f.produce(0, 10)
	f.produce(1, 3)
	var n int
	require.NoError(t, f.pool.QueryRow(f.ctx, "SELECT streamd.apply_size_retention($1, 5)", f.stream).Scan(&n))
	require.Equal(t, 5, n)
	require.Equal(t, seq(5, 10), f.stored(0), "exactly the newest 5")
	require.Equal(t, seq(0, 3), f.stored(1), "fewer than N: untouched")
	start, _ := f.head(0)
	require.Equal(t, int64(5), start)

	require.NoError(t, f.pool.QueryRow(f.ctx, "SELECT streamd.apply_size_retention($1, 5)", f.stream).Scan(&n))
	require.Equal(t, 0, n, "exactly N: nothing more")
	require.NoError(t, f.pool.QueryRow(f.ctx, "SELECT streamd.apply_size_retention($1, 4)", f.stream).Scan(&n))
	require.Equal(t, 1, n)
	require.Equal(t, seq(6, 10), f.stored(0))
	require.NoError(t, f.pool.QueryRow(f.ctx, "SELECT streamd.apply_size_retention($1, 0)", f.stream).Scan(&n))
	require.Equal(t, 4+3, n)
	require.Empty(t, f.stored(0))
	start, end := f.head(0)
	require.Equal(t, [2]int64{10, 10}, [2]int64{start, end})

	// Appends continue from the log end after everything was deleted.
	pos := f.produce(0, 1)
	require.Equal(t, int64(10), pos[0].Offset)
}

// Bad arguments are refused with a typed error naming the argument, and nothing is
// deleted.
func TestRetentionBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	f.produce(0, 3)
	for _, c := range []struct{ sql, field string }{
		{"SELECT streamd.apply_time_retention($1, 0)", "max_age_seconds"},
		{"SELECT streamd.apply_time_retention($1, -5)", "max_age_seconds"},
		{"SELECT streamd.apply_time_retention($1, NULL)", "max_age_seconds"},
		{"SELECT streamd.apply_size_retention($1, -1)", "max_event_count"},
		{"SELECT streamd.retention_delete_batch($1, 0, 0)", "batch limit"},
		{"SELECT streamd.retention_advance($1, 0, -1)", "target offset"},
		{"SELECT streamd.compact_partition($1, 0, 0, 60, now(), NULL)", "dry_run"},
		{"SELECT streamd.compact_partition($1, 0, 0, -1, now(), false)", "tombstone_retention_seconds"},
	} {
		_, err := f.pool.Exec(f.ctx, c.sql, f.stream)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, c.sql)
		require.Equal(t, "SD302", pgErr.Code, c.sql)
		require.Contains(t, pgErr.Message, c.field, c.sql)
	}
	_, err := f.pool.Exec(f.ctx, "SELECT streamd.apply_size_retention($1, 1)", "no-such-stream-"+f.stream)
	require.Equal(t, "SD001", pgCode(err))
	require.Equal(t, seq(0, 3), f.stored(0))

	_, err = f.runner.Apply(f.ctx, f.stream, nil)
	require.ErrorIs(t, err, retention.ErrNoPolicy)
	_, err = f.runner.Apply(f.ctx, "missing-"+f.stream, nil)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
	_, err = retention.New(f.pool, &retention.Config{BatchSize: -1})
	require.ErrorIs(t, err, retention.ErrInvalidArgument)
	require.ErrorContains(t, err, "BatchSize")
	require.Equal(t, seq(0, 3), f.stored(0))
}

func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Retention by bytes keeps the newest records whose stored payloads fit the limit and
// not one more.
func TestSizeBytesRetention(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	recs := make([]streams.Record, 20)
	for i := range recs {
		b := make([]byte, 100+i*10)
		recs[i] = streams.Record{Stream: f.stream, Partition: streams.PartitionOf(0), Bytes: b}
	}
	_, err := f.client.Produce(f.ctx, recs...)
	require.NoError(t, err)
	const limit = 1000
	f.policy("max_size_bytes = $2", limit)
	res, err := f.runner.Apply(f.ctx, f.stream, nil)
	require.NoError(t, err)
	require.Positive(t, res.Deleted())

	var kept, withPrev int64
	start, _ := f.head(0)
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT coalesce(sum(pg_column_size(data_bytes)), 0) FROM streamd.events
		WHERE stream_name = $1 AND partition = 0`, f.stream).Scan(&kept))
	require.LessOrEqual(t, kept, int64(limit), "retained payloads fit the limit")
	// The newest deleted record would not have fitted: its size was 100+10*(start-1) plus the 4-byte header.
	withPrev = kept + int64(100+10*(start-1)) + 4
	require.Greater(t, withPrev, int64(limit), "retention deleted no record that fitted")
	require.Equal(t, seq(start, 20), f.stored(0))
}

// Consumer-aware retention never deletes below a live group's committed offset, ignores
// groups whose members are all past their session timeout, and Force overrides it.
func TestConsumerAwareRetention(t *testing.T) {
	t.Parallel()
	f := setup(t, 2)
	f.produce(0, 20)
	f.produce(1, 20)
	now := time.Now()
	f.group("slow", 0, 4, now)
	f.group("fast", 0, 15, now)
	f.commit("fast", 1, 18)
	f.group("dead", 0, 1, now.Add(-time.Hour)) // all members stale: no protection
	f.policy("max_event_count = 2, protect_consumers = true")

	dry, err := f.runner.Apply(f.ctx, f.stream, &retention.ApplyOpts{DryRun: true, Now: now})
	require.NoError(t, err)
	require.Equal(t, int64(4), dry.Partitions[0].NewLogStartOffset)
	require.Equal(t, "slow", dry.Partitions[0].LimitedBy)
	require.Equal(t, int64(18), dry.Partitions[1].NewLogStartOffset, "no more than the committed offset of 'fast' on partition 1")

	res, err := f.runner.Apply(f.ctx, f.stream, &retention.ApplyOpts{Now: now})
	require.NoError(t, err)
	require.Equal(t, dry.Partitions[0].Deleted, res.Partitions[0].Deleted)
	require.Equal(t, seq(4, 20), f.stored(0), "nothing at or above the slowest live group's offset deleted")
	require.Equal(t, seq(18, 20), f.stored(1))

	// The same through the seed's function, which honours the policy's protection.
	var n int
	require.NoError(t, f.pool.QueryRow(f.ctx, "SELECT streamd.apply_size_retention($1, 0)", f.stream).Scan(&n))
	require.Equal(t, 0, n)

	// A clock running ahead of the database's (retention's Now is the caller's) does
	// not make the live group dead: liveness is judged by the clock of the heartbeats.
	_, err = f.runner.Apply(f.ctx, f.stream, &retention.ApplyOpts{Now: now.Add(10 * time.Minute)})
	require.NoError(t, err)
	require.Equal(t, seq(4, 20), f.stored(0), "a skewed clock deleted what a live group has not read")

	// The slow group moves on: retention follows it.
	f.commit("slow", 0, 10)
	_, err = f.runner.Apply(f.ctx, f.stream, &retention.ApplyOpts{Now: now})
	require.NoError(t, err)
	require.Equal(t, seq(10, 20), f.stored(0))

	// Once its members are stale, the group no longer protects anything.
	f.group("slow", 0, 10, now.Add(-time.Hour))
	f.group("fast", 0, 15, now.Add(-time.Hour))
	res, err = f.runner.Apply(f.ctx, f.stream, &retention.ApplyOpts{Now: now})
	require.NoError(t, err)
	require.Equal(t, seq(18, 20), f.stored(0))
	require.Empty(t, res.Partitions[0].LimitedBy)

	// Force ignores live groups.
	f.group("slow", 1, 18, time.Now())
	f.commit("slow", 1, 18)
	f.produce(1, 5)
	_, err = f.runner.Apply(f.ctx, f.stream, &retention.ApplyOpts{Force: true})
	require.NoError(t, err)
	require.Equal(t, seq(23, 25), f.stored(1))
}

// A dry run reports per partition exactly what the real run then deletes, and deletes
// nothing itself; this holds for age, count and compaction together.
func TestDryRunCountsEqualRealRun(t *testing.T) {
	t.Parallel()
	f := setup(t, 3)
	now := time.Now()
	old := []time.Time{now.Add(-72 * time.Hour), now.Add(-71 * time.Hour), now.Add(-70 * time.Hour)}
	f.backdate(0, old)
	f.backdate(2, old[:1])
	f.produce(0, 9)
	f.produce(1, 30)
	keyed := []streams.Record{}
	for i := 0; i < 12; i++ {
		keyed = append(keyed, streams.Record{Stream: f.stream, Partition: streams.PartitionOf(2), Key: []string{"a", "b", "c"}[i%3],
			Data: json.RawMessage(`{"v":1}`)})
	}
	_, err := f.client.Produce(f.ctx, keyed...)
	require.NoError(t, err)
	f.policy("max_age_seconds = 86400, max_event_count = 25, cleanup_policy = 'compact,delete'")

	dry, err := f.runner.Apply(f.ctx, f.stream, &retention.ApplyOpts{DryRun: true, Now: now})
	require.NoError(t, err)
	require.True(t, dry.DryRun)
	require.Equal(t, seq(0, 12), f.stored(0), "a dry run deletes nothing")
	require.Equal(t, []int64{3, 5, 1}, []int64{dry.Partitions[0].Deleted, dry.Partitions[1].Deleted, dry.Partitions[2].Deleted})
	require.Equal(t, int64(9), dry.Partitions[2].Compacted, "12 keyed records, 3 keys: 9 superseded")

	real, err := f.runner.Apply(f.ctx, f.stream, &retention.ApplyOpts{Now: now})
	require.NoError(t, err)
	for i := range dry.Partitions {
		d, r := dry.Partitions[i], real.Partitions[i]
		require.Equal(t, d.Deleted, r.Deleted, "partition %d", i)
		require.Equal(t, d.Compacted, r.Compacted, "partition %d", i)
		require.Equal(t, d.NewLogStartOffset, r.NewLogStartOffset, "partition %d", i)
	}
	require.Equal(t, []int64{10, 11, 12}, f.stored(2), "the latest record of each key survives compaction")

	// The same through SQL: the dry run of apply_policy equals what apply_policy deletes.
	f.produce(1, 10)
	var dryN, realN int64
	require.NoError(t, f.pool.QueryRow(f.ctx, "SELECT sum(deleted + compacted) FROM streamd.apply_policy($1, $2, false, true)", f.stream, now).Scan(&dryN))
	require.NoError(t, f.pool.QueryRow(f.ctx, "SELECT sum(deleted + compacted) FROM streamd.apply_policy($1, $2, false, false)", f.stream, now).Scan(&realN))
	require.Equal(t, int64(10), dryN)
	require.Equal(t, dryN, realN)
}

// Compaction keeps the latest record per key, removes a tombstone only after the
// delay, keeps keyless records, and readers skip the holes it leaves.
func TestCompaction(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	p := streams.PartitionOf(0)
	rec := func(key, data string) streams.Record {
		r := streams.Record{Stream: f.stream, Partition: p, Key: key}
		if data != "" {
			r.Data = json.RawMessage(data)
		}
		return r
	}
	_, err := f.client.Produce(f.ctx,
		rec("a", `1`), rec("b", `1`), rec("a", `2`), rec("", `0`), rec("b", ""), rec("c", `1`), rec("a", `3`))
	require.NoError(t, err)
	// offsets: 0 a1, 1 b1, 2 a2, 3 keyless, 4 b tombstone, 5 c1, 6 a3
	f.policy("cleanup_policy = 'compact', tombstone_retention_seconds = 3600")

	res, err := f.runner.Apply(f.ctx, f.stream, nil)
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Compacted())
	require.Equal(t, []int64{3, 4, 5, 6}, f.stored(0), "superseded a1, b1, a2 gone; the young tombstone stays")
	start, _ := f.head(0)
	require.Equal(t, int64(0), start, "compaction does not move the log start")

	fr, err := f.client.Fetch(f.ctx, f.stream, 0, 0, nil)
	require.NoError(t, err)
	require.Len(t, fr.Events, 4)
	require.Equal(t, int64(3), fr.Events[0].Offset, "a reader at 0 skips the holes")

	res, err = f.runner.Apply(f.ctx, f.stream, &retention.ApplyOpts{Now: time.Now().Add(2 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Compacted())
	require.Equal(t, []int64{3, 5, 6}, f.stored(0), "the tombstone goes after the delay")
}

// Two runners (two streamd instances) never process one stream at once: while one
// holds the stream, the other gets ErrBusy and deletes nothing; Run applies policies
// on its interval and returns nil when its context ends.
func TestRunnerOneAtATimeAndRun(t *testing.T) {
	t.Parallel()
	f := setup(t, 1)
	f.produce(0, 10)
	f.policy("max_event_count = 3")

	other, err := f.pool.Acquire(f.ctx)
	require.NoError(t, err)
	defer other.Release()
	_, err = other.Exec(f.ctx, "SELECT pg_advisory_lock($1, hashtext($2))", int32(0x53445233), f.stream)
	require.NoError(t, err)
	_, err = f.runner.Apply(f.ctx, f.stream, nil)
	require.ErrorIs(t, err, retention.ErrBusy)
	results, err := f.runner.RunOnce(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, results)
	require.Equal(t, seq(0, 10), f.stored(0))
	_, err = other.Exec(f.ctx, "SELECT pg_advisory_unlock($1, hashtext($2))", int32(0x53445233), f.stream)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.runner.Run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for len(f.stored(0)) != 3 {
		require.True(t, time.Now().Before(deadline), "Run did not apply the policy")
		time.Sleep(5 * time.Millisecond)
	}
	f.produce(0, 4)
	for len(f.stored(0)) != 3 {
		require.True(t, time.Now().Before(deadline), "Run did not apply the policy again")
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	require.Equal(t, seq(11, 14), f.stored(0))
	_ = testdb.Name
}

// cancelOn is a slog handler that cancels a context at the first record with msg.
type cancelOn struct {
	msg    string
	cancel context.CancelFunc
}

func (h cancelOn) Enabled(context.Context, slog.Level) bool { return true }
func (h cancelOn) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.cancel()
	}
	return nil
}
func (h cancelOn) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h cancelOn) WithGroup(string) slog.Handler      { return h }

// TestRunOnceCutShortReportsIt: a pass whose ctx ends after its first stream returns
// an error (so a coordinator slot is not recorded as run, and the next leader runs
// it); it returned nil, and the successor skipped the other streams until the next
// slot.
func TestRunOnceCutShortReportsIt(t *testing.T) {
	t.Parallel()
	first, second := setup(t, 1), setup(t, 1)
	for _, f := range []*fixture{first, second} {
		f.produce(0, 5)
		f.policy("max_event_count = 2")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := retention.New(first.pool, &retention.Config{Streams: []string{first.stream, second.stream},
		Logger: slog.New(cancelOn{msg: "retention applied", cancel: cancel})})
	require.NoError(t, err)
	results, err := r.RunOnce(ctx, nil)
	require.ErrorIs(t, err, context.Canceled, "the pass was cut short after %d streams", len(results))
	require.Len(t, results, 1)
}

// failOn is a query tracer that fails the first query whose SQL contains sql and
// whose second argument is arg, by handing pgx an already cancelled context for it.
type failOn struct {
	sql string
	arg any
}

func (f failOn) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, f.sql) && len(data.Args) > 1 && data.Args[1] == f.arg {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		return cctx
	}
	return ctx
}

func (failOn) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A pass that fails part way counts the rows it deleted before the failure (they are
// gone: each batch committed), in the metrics and in the result it returns; the
// partitions it did not reach show nothing deleted and their log start unmoved. The
// metric recorded 0, and the result showed the planned counts of the partitions not
// reached.
func TestFailedPassCountsWhatItDeleted(t *testing.T) {
	t.Parallel()
	f := setup(t, 3)
	for p := int32(0); p < 3; p++ {
		f.produce(p, 20)
	}
	f.policy("max_event_count = 5")

	cfg := testdb.Config(t)
	cfg.ConnConfig.Tracer = failOn{sql: "retention_advance", arg: int32(1)} // partition 1
	pool, err := pgxpool.NewWithConfig(f.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	reg := prometheus.NewRegistry()
	r, err := retention.New(pool, &retention.Config{BatchSize: 7, Registerer: reg})
	require.NoError(t, err)

	res, err := r.Apply(f.ctx, f.stream, nil)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, seq(15, 20), f.stored(0), "partition 0 was done")
	require.Equal(t, seq(0, 20), f.stored(1), "partition 1 failed")
	require.Equal(t, seq(0, 20), f.stored(2), "partition 2 was not reached")

	require.Equal(t, 1.0, testmetrics.Value(t, reg, "streamd_retention_passes_total", "result", "error"))
	require.Equal(t, 15.0, testmetrics.Value(t, reg, "streamd_retention_deleted_events_total", "kind", "delete"))

	require.NotNil(t, res)
	require.Equal(t, int64(15), res.Deleted())
	require.Equal(t, int64(15), res.Partitions[0].Deleted)
	require.Equal(t, int64(15), res.Partitions[0].NewLogStartOffset)
	for _, p := range res.Partitions[1:] {
		require.Equal(t, int64(0), p.Deleted, "partition %d: nothing deleted", p.Partition)
		require.Equal(t, int64(0), p.NewLogStartOffset, "partition %d: log start unmoved", p.Partition)
	}

	// The next pass finishes the job and counts only what it deletes.
	res, err = f.runner.Apply(f.ctx, f.stream, nil)
	require.NoError(t, err)
	require.Equal(t, int64(30), res.Deleted())
	require.Equal(t, seq(15, 20), f.stored(1))
	require.Equal(t, seq(15, 20), f.stored(2))
}
