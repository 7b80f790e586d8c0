package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestViewsScenario runs the views scenario at the tiny size: every query ran, the
// views touched a bounded number of events rows (two probes per partition at most)
// while the baseline scanned the stream.
func TestViewsScenario(t *testing.T) {
	t.Parallel()
	env := tinyEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := viewsScenario{}.Run(ctx, env)
	require.NoError(t, err)
	require.Len(t, res, len(viewQueries))
	for _, r := range res {
		require.NotNil(t, r.Timing, r.Case)
		require.Positive(t, r.Timing.Count, r.Case)
		require.Zero(t, r.Records, r.Case)
		if !r.Baseline {
			require.Positive(t, r.Ratio, r.Case)
		}
		t.Logf("%-52s p50 %7.2f ms  ratio %6.1f  %s", r.Case, r.Timing.P50, r.Ratio, r.Note)
	}
	require.Len(t, env.Notes, 1)
	t.Log(env.Notes[0].Text)
}
