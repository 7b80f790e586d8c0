package bench

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/tailer/tailertest"
	"github.com/streamd/streamd/streams"
)

// TestLatencyScenario runs the latency scenario alone (tiny durations; set
// STREAMD_BENCH_LATENCY to a duration such as 10s for real figures) and checks that
// every mode delivered every event and reported a distribution.
func TestLatencyScenario(t *testing.T) {
	// A private cluster: creating a logical slot waits for other tests' open
	// transactions (see tailertest). Commits are synchronous (the default
	// synchronous_commit: the WAL sender sends only flushed WAL, so with asynchronous
	// commits the tailer would wait for the WAL writer), with fsync off: latency is
	// measured from the commit's return, and disk flushes would only slow the
	// producers below the target rate.
	_, url := tailertest.Cluster(t, nil)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer pool.Close()
	suite := TinySuite()
	suite.LatencyDuration = 750 * time.Millisecond
	if v := os.Getenv("STREAMD_BENCH_LATENCY"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err)
		suite.LatencyDuration = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env := &Env{Pool: pool, Client: streams.NewClient(pool, nil), Suite: suite, RunID: randomID(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	res, err := latencyScenario{}.Run(ctx, env)
	require.NoError(t, err)
	require.Len(t, res, 10) // 3 wake-up modes × 2, poll, group-tailer, 2 keep-up
	require.NotEmpty(t, find(res, "latency group-tailer 1000/s").Case)
	for _, r := range res {
		if r.System == "tailer-keepup" {
			require.Positive(t, r.Records, r.Case)
			t.Logf("%-32s %8d records %8.0f/s  (%s)", r.Case, r.Records, r.RecordsPerSec, r.Note)
			continue
		}
		// Timing-only; the scenario fails when an event was not delivered.
		require.NotNil(t, r.Timing, r.Case)
		require.Positive(t, r.Timing.Count, r.Case)
		if r.Baseline {
			require.Contains(t, r.System, "listen", r.Case)
		} else {
			require.Positive(t, r.Ratio, "%s: ratio to %q", r.Case, r.RatioTo)
		}
		t.Logf("%-32s %6d events  p50 %6.3f ms  p99 %6.3f ms  max %7.3f ms  ratio %.2f  (%s)",
			r.Case, r.Timing.Count, r.Timing.P50, r.Timing.P99, r.Timing.Max, r.Ratio, r.Note)
	}
}

// TestGroupStampsWarmUpIsPerPartition: a warm-up event delivered twice (a rebalance
// before the consumer's first commit) must not stand in for another partition's.
func TestGroupStampsWarmUpIsPerPartition(t *testing.T) {
	lanes := []*latencyLane{{partition: 0, base: 1, seen: make([]atomic.Int64, 4)}, {partition: 1, base: 1, seen: make([]atomic.Int64, 4)}}
	st := newGroupStamps(lanes, 4, "test", func(ln *latencyLane) []atomic.Int64 { return ln.seen })
	st.stamp(0, 0, 1)
	st.stamp(0, 0, 2) // partition 0's warm-up again; partition 1's not yet delivered
	require.Less(t, st.warm.Load(), int64(len(lanes)), "await would start the timed part before partition 1 was read")
}
