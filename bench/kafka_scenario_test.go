package bench

import (
	"context"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/tailer/tailertest"
	"github.com/streamd/streamd/streams"
)

// TestKafkaScenarioEndToEnd runs the kafka scenario's end-to-end modes (native and
// franz-go group consumers woken through the tailer: at the same time on the same
// events, then one after the other) at a tiny duration on a private cluster, as
// TestLatencyScenario does (the tiny suite leaves them out), and checks that both
// delivered every event, that the paired cases cover the same events with the
// per-event difference, that the target names the paired cases and can be stated, and
// that the latency target is stated from the sequential group-tailer case.
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
	require.Len(t, res, 5) // paired: native, kafka, difference; sequential: native, kafka
	for _, r := range res {
		require.Equal(t, "kafka", r.Scenario)
		require.NotNil(t, r.Timing, r.Case)
		require.Positive(t, r.Timing.Count, r.Case)
		t.Logf("%-44s %6d events  p50 %6.3f ms  p99 %6.3f ms  (%s)", r.Case, r.Timing.Count, r.Timing.P50, r.Timing.P99, r.Note)
	}
	native, kafka, diff := find(res, e2eCase("kafka-paired-native")), find(res, e2eCase("kafka-paired-kafka")), find(res, e2eCase("kafka-paired-diff"))
	require.NotEmpty(t, native.Case)
	require.NotEmpty(t, kafka.Case)
	require.NotEmpty(t, diff.Case)
	// One sample per event in each: both consumers got every event of the run.
	require.Equal(t, native.Timing.Count, kafka.Timing.Count)
	require.Equal(t, native.Timing.Count, diff.Timing.Count)
	require.Equal(t, native.Case, kafka.RatioTo)
	require.Positive(t, kafka.Ratio)
	for _, r := range []Result{native, kafka, diff} {
		require.Equal(t, "kafka e2e paired", r.Paired, r.Case)
	}
	seq := find(res, e2eCase("kafka-group"))
	require.Equal(t, e2eCase("group-tailer"), seq.RatioTo)
	require.Positive(t, seq.Ratio)

	rep := &Report{Results: res}
	stated := 0
	for _, h := range rep.headlines() {
		if strings.HasPrefix(h, "Kafka end to end") {
			require.Regexp(t, `\*\*(meets|below)\*\*$`, h)
			require.Contains(t, h, "`"+kafka.Case+"`")
			require.Contains(t, h, "`"+native.Case+"`")
			require.Contains(t, h, "`"+diff.Case+"`")
			stated++
		}
	}
	require.Equal(t, 1, stated)
	// The latency target (commit → group handler) is stated from this scenario's
	// sequential group-tailer case: the quick suite measures it here only.
	require.Regexp(t, "`"+regexp.QuoteMeta(e2eCase("group-tailer"))+"`: p50 .* ms, p99 .* ms over [0-9]+ sample\\(s\\).*: \\*\\*(meets|below)\\*\\*$", latencyHeadline(t, res))
}
