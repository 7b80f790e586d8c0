package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRebalanceScenario runs the rebalance scenario at the tiny size (one repetition
// per case): every case settled, and the kill case within 10 s of the session timeout.
func TestRebalanceScenario(t *testing.T) {
	t.Parallel()
	env := tinyEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := rebalanceScenario{}.Run(ctx, env)
	require.NoError(t, err)
	require.Len(t, res, 4) // joins 1→2, 2→3, 3→4 and the kill
	for _, r := range res {
		require.NotNil(t, r.Timing, r.Case)
		require.EqualValues(t, 1, r.Timing.Count, r.Case)
		require.Len(t, r.Timing.Samples, 1, r.Case)
		require.Zero(t, r.Records, r.Case)
		t.Logf("%-28s p50 %8.1f ms  max %8.1f ms  (%s)", r.Case, r.Timing.P50, r.Timing.Max, r.Note)
	}
	require.Less(t, res[3].Timing.Max, 10_000.0)
}
