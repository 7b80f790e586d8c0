package bench

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/tailer/tailertest"
	"github.com/streamd/streamd/streams"
)

// TestKafkaScenarioEndToEnd runs the kafka scenario's end-to-end modes (native and
// franz-go group consumers woken through the tailer) at a tiny duration on a private
// cluster, as TestLatencyScenario does (the tiny suite leaves them out), and checks
// that both delivered every event and that the target can be stated.
func TestKafkaScenarioEndToEnd(t *testing.T) {
	_, url := tailertest.Cluster(t, nil)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer pool.Close()
	suite := TinySuite()
	suite.KafkaLatencyDuration = 750 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env := &Env{Pool: pool, Client: streams.NewClient(pool, nil), Suite: suite, RunID: randomID(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	res, err := kafkaScenario{}.endToEnd(ctx, env)
	require.NoError(t, err)
	require.Len(t, res, 2)
	for _, r := range res {
		require.Equal(t, "kafka", r.Scenario)
		require.NotNil(t, r.Timing, r.Case)
		require.Positive(t, r.Timing.Count, r.Case)
		t.Logf("%-36s %6d events  p50 %6.3f ms  p99 %6.3f ms  (%s)", r.Case, r.Timing.Count, r.Timing.P50, r.Timing.P99, r.Note)
	}
	require.Positive(t, res[1].Ratio)
	rep := &Report{Results: res}
	stated := 0
	for _, h := range rep.headlines() {
		if strings.HasPrefix(h, "Kafka end to end") {
			require.Regexp(t, `\*\*(meets|below)\*\*$`, h)
			stated++
		}
	}
	require.Equal(t, 1, stated)
}
