package bench

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// tinyEnv is an Env on the test database at the tiny suite's sizes.
func tinyEnv(t *testing.T) *Env {
	pool := testdb.Pool(t)
	return &Env{Pool: pool, Client: streams.NewClient(pool, nil), Suite: TinySuite(), RunID: randomID(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// TestConsumeScenario runs the consume scenario at the tiny size: each case counts
// the records of its steady part (some, never more than were read), each group case has
// its raw baseline's ratio, and each group case has its start-up timing, one sample
// per group and repetition.
func TestConsumeScenario(t *testing.T) {
	t.Parallel()
	env := tinyEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := consumeScenario{}.Run(ctx, env)
	require.NoError(t, err)
	require.Len(t, res, 6)
	for _, r := range res[:4] {
		read := int64(4000 * max(1, r.Params.Conns/consumePartitions))
		require.Positive(t, r.Records, r.Case)
		require.Less(t, r.Records, read, "%s: the steady part leaves out the first batches", r.Case)
		require.Positive(t, r.Bytes, r.Case)
		require.NotNil(t, r.Latency, r.Case)
		if !r.Baseline {
			require.Positive(t, r.Ratio, r.Case)
		}
		t.Logf("%-44s %8.0f rec/s  ratio %.2f  p50 %.2f ms", r.Case, r.RecordsPerSec, r.Ratio, r.Latency.P50)
	}
	for i, groups := range []int{1, 5} {
		j := res[4+i]
		require.Equal(t, res[1+2*i].Case+" join", j.Case)
		require.NotNil(t, j.Timing, j.Case)
		require.EqualValues(t, groups, j.Timing.Count, "%s: one start-up per group (the tiny suite runs once)", j.Case)
		require.Positive(t, j.Timing.P50, j.Case)
	}
}

// TestConsumeCasesLastTheCaseDuration: each consume case's stream lasts at least the
// suite's CaseDuration at rates above the quiet machine's (at 200k records a side's
// read lasted 0.5–1.2 s in the quick suite, and one stall was a fifth of it).
func TestConsumeCasesLastTheCaseDuration(t *testing.T) {
	for _, s := range []Suite{QuickSuite(), FullSuite()} {
		one, five := consumeSizes(s)
		require.GreaterOrEqual(t, float64(one)/consumeFastest1, s.CaseDuration.Seconds(), "%s: one group", s.Name)
		require.GreaterOrEqual(t, float64(5*five)/consumeFastest5, s.CaseDuration.Seconds(), "%s: five groups", s.Name)
		require.Zero(t, one%(consumePartitions*consumeBatch), s.Name)
		require.Zero(t, five%(consumePartitions*consumeBatch), s.Name)
	}
	// Not lowered to pass: above the last quiet quick suite's steady rates (session 15,
	// 11:21, with the fill vacuumed: one group 564k records/s, its raw readers 458k;
	// five groups 580k, raw 487k; session 14: 269k, 366k, 399k, 451k).
	require.GreaterOrEqual(t, consumeFastest1, 564_000)
	require.GreaterOrEqual(t, consumeFastest5, 580_000)
}
