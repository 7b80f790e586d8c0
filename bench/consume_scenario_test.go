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

// TestConsumeScenario runs the consume scenario at the tiny size: every group read
// every record, and each group case has its raw baseline's ratio.
func TestConsumeScenario(t *testing.T) {
	t.Parallel()
	env := tinyEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := consumeScenario{}.Run(ctx, env)
	require.NoError(t, err)
	require.Len(t, res, 4)
	for _, r := range res {
		require.EqualValues(t, 4000*max(1, r.Params.Conns/consumePartitions), r.Records, r.Case)
		require.Positive(t, r.Bytes, r.Case)
		require.NotNil(t, r.Latency, r.Case)
		if !r.Baseline {
			require.Positive(t, r.Ratio, r.Case)
		}
		t.Logf("%-44s %8.0f rec/s  ratio %.2f  p50 %.2f ms", r.Case, r.RecordsPerSec, r.Ratio, r.Latency.P50)
	}
}
