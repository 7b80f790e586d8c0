package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRetentionScenario runs the retention scenario at the tiny size: every side
// deleted exactly the records below the policy's line, and streamd has its ratio.
func TestRetentionScenario(t *testing.T) {
	t.Parallel()
	env := tinyEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The suite makes the baseline table (Run); this test may run without it. No other
	// parallel test uses the table.
	require.NoError(t, setupBaselineSchema(ctx, env.Pool))
	res, err := retentionScenario{}.Run(ctx, env)
	require.NoError(t, err)
	require.Len(t, res, 3)
	for _, r := range res {
		require.EqualValues(t, 5000, r.Records, r.Case)
		require.Positive(t, r.Bytes, r.Case)
		require.NotNil(t, r.Latency, r.Case)
		t.Logf("%-48s %9.0f rows/s  ratio %.2f", r.Case, r.RecordsPerSec, r.Ratio)
	}
	require.Positive(t, res[0].Ratio)
}
