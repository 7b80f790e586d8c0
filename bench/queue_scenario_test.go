package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestQueueScenario runs the queue scenario at the tiny size: every case drained every
// message it sent (whole rotations), and each streamd case has its ratio to the raw drain with the same
// number of workers.
func TestQueueScenario(t *testing.T) {
	t.Parallel()
	env := tinyEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := queueScenario{}.Run(ctx, env)
	require.NoError(t, err)
	require.Len(t, res, len(queueSystems)*len(env.Suite.QueueWorkers))
	for _, r := range res {
		// Every message sent came back, in as many rotations as the case needed to
		// run for the suite's case duration.
		require.GreaterOrEqual(t, r.Records, int64(env.Suite.QueueMessages), r.Case)
		require.Zero(t, r.Records%int64(env.Suite.QueueMessages), r.Case)
		require.Positive(t, r.Bytes, r.Case)
		require.NotNil(t, r.Latency, r.Case)
		if r.Baseline {
			require.Empty(t, r.RatioTo, r.Case)
		} else {
			base := find(res, r.RatioTo)
			require.Equal(t, "raw-skip-locked", base.System, r.Case)
			require.Equal(t, r.Params.Conns, base.Params.Conns, r.Case)
			require.Positive(t, r.Ratio, r.Case)
			// Only streamd's cases carry issue 4's target; pgmq-batched is a comparison.
			require.Equal(t, strings.HasPrefix(r.System, "streamd"), r.Target > 0, r.Case)
		}
		t.Logf("%-40s %8.0f msgs/s  ratio %.2f  p50 %.2f ms  (%s)", r.Case, r.RecordsPerSec, r.Ratio, r.Latency.P50, r.Note)
	}
	var left int
	require.NoError(t, env.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'streamd_bench' AND tablename = ANY($1)`,
		[]string{"queue_raw_" + env.RunID, "queue_pgmq_" + env.RunID}).Scan(&left))
	require.Zero(t, left, "the raw and pgmq tables are dropped")
}
