package bench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// TestTinySuite runs every scenario at a tiny size so that the harness cannot break
// silently. It checks that results exist and are sane, never a ratio's value.
func TestTinySuite(t *testing.T) {
	pool := testdb.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	rep, err := Run(ctx, pool, Options{Suite: TinySuite()})
	require.NoError(t, err)

	scenarios := map[string]int{}
	for _, r := range rep.Results {
		scenarios[r.Scenario]++
		if r.Timing != nil { // timing-only: no records, a distribution of durations
			require.Zero(t, r.Records, r.Case)
			require.Zero(t, r.RecordsPerSec, r.Case)
			require.Nil(t, r.Latency, r.Case)
			require.Positive(t, r.Timing.Count, r.Case)
			require.NotEmpty(t, r.Timing.Op, r.Case)
			require.LessOrEqual(t, r.Timing.P50, r.Timing.P99, r.Case)
			require.LessOrEqual(t, r.Timing.P99, r.Timing.Max, r.Case)
		} else {
			require.Positive(t, r.Records, r.Case)
			require.Positive(t, r.Bytes, r.Case)
			require.Positive(t, r.Seconds, r.Case)
			require.Positive(t, r.RecordsPerSec, r.Case)
			require.NotNil(t, r.Latency, r.Case)
			require.LessOrEqual(t, r.Latency.P50, r.Latency.P99, r.Case)
		}
		if r.RatioTo != "" {
			require.Positive(t, r.Ratio, "%s: ratio to %s", r.Case, r.RatioTo)
			require.NotEmpty(t, find(rep.Results, r.RatioTo).Case, "%s: baseline %s missing", r.Case, r.RatioTo)
		}
	}
	for _, s := range Scenarios() {
		if s.Name() == "latency" {
			continue // not in the tiny suite: TestLatencyScenario runs it on a private cluster
		}
		require.Positive(t, scenarios[s.Name()], "scenario %s produced no results", s.Name())
	}
	require.Zero(t, scenarios["latency"])
	require.NotEmpty(t, rep.Postgres.Settings["synchronous_commit"])
	require.NotEmpty(t, rep.Machine.Hostname)

	dir := t.TempDir()
	require.NoError(t, rep.WriteCharts(dir))
	require.NotEmpty(t, rep.Charts)
	require.Contains(t, rep.Charts, rep.Slug()+"-queue-workers.svg")
	require.Contains(t, rep.Charts, rep.Slug()+"-growth.svg")
	for _, c := range rep.Charts {
		b, err := os.ReadFile(filepath.Join(dir, c))
		require.NoError(t, err)
		require.Contains(t, string(b), "<polyline", c)
	}
	path, err := rep.WriteJSON(dir)
	require.NoError(t, err)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var back Report
	require.NoError(t, json.Unmarshal(b, &back))
	require.Len(t, back.Results, len(rep.Results))

	md := filepath.Join(dir, "RESULTS.md")
	require.NoError(t, os.WriteFile(md, []byte("# Results\n\nhand-written\n"), 0o644))
	require.NoError(t, rep.UpdateResultsMD(md, "."))
	require.NoError(t, rep.UpdateResultsMD(md, ".")) // replaces, does not append twice
	b, err = os.ReadFile(md)
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(string(b), generatedBegin))
	require.Contains(t, string(b), "hand-written")
	require.Contains(t, string(b), "produce streamd")
	require.Contains(t, string(b), "### Timings")
	require.Contains(t, string(b), "| rebalance join 1→2")

	var table strings.Builder
	require.NoError(t, rep.WriteTable(&table))
	require.Contains(t, table.String(), "case (timing)")
}
