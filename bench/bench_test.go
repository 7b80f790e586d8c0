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
	// Three minutes: every scenario (the kafka one adds about 10 s) on a loaded 2-core
	// machine; it took 2 min 3 s at load average 30 when it was 2.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
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
		switch r.Scenario {
		case "growth", "retention":
			require.Equal(t, 1, r.Repeats, "%s runs once", r.Case)
		default:
			require.Equal(t, 2, r.Repeats, r.Case)
			if r.Ratio != 0 {
				require.Len(t, r.RatioSamples, 2, r.Case)
			}
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
	require.Contains(t, string(b), "### Targets")
	for _, tg := range targets() {
		require.Contains(t, string(b), tg.Goal)
	}

	var table strings.Builder
	require.NoError(t, rep.WriteTable(&table))
	require.Contains(t, table.String(), "case (timing)")
}

// TestHeadlineStatesTheNamedConfiguration checks the headline's rules on a report
// made by hand: the target's own case, its ratio paired repeat by repeat with the
// baseline of the same run, the median and the spread; a better case of another
// configuration shown only beside it, labelled; a missing case said to be missing.
func TestHeadlineStatesTheNamedConfiguration(t *testing.T) {
	named := Result{Scenario: "consume", System: "consume-group", Case: "consume consume-group 100B b=500 c=4 p=4 auto-commit",
		RecordsPerSec: 50, RateSamples: []float64{40, 50, 70}, Ratio: 0.5, RatioTo: "consume raw-select 100B b=500 c=4 p=4", Repeats: 3}
	base := Result{Scenario: "consume", System: "raw-select", Baseline: true, Case: "consume raw-select 100B b=500 c=4 p=4",
		RecordsPerSec: 100, RateSamples: []float64{100, 100, 70}, Repeats: 3}
	better := Result{Scenario: "consume", System: "consume-group", Case: "consume consume-group 100B b=5000 c=4 p=4 auto-commit",
		RecordsPerSec: 95, Ratio: 0.95, RatioTo: base.Case, Repeats: 1}
	rep := &Report{Results: []Result{named, base, better}}
	var line string
	for _, tg := range targets() {
		if tg.Case == named.Case {
			line = rep.headline(tg)
		}
	}
	// Paired ratios 0.4, 0.5, 1.0: median 0.5, below 0.8 (the mean of the rates,
	// or the best repeat, would say otherwise).
	require.Contains(t, line, "**0.50×**")
	require.Contains(t, line, "median of 3 repeats, spread 0.40–1.00")
	require.Contains(t, line, "**below**")
	require.Contains(t, line, "best case, another configuration, for comparison only: `"+better.Case+"` 0.95×")

	lines := rep.headlines()
	require.Len(t, lines, len(targets()))
	require.Contains(t, strings.Join(lines, "\n"), "**not measured in this run** (no case `produce streamd 100B b=1000 c=4 p=4`)")
}

// TestAggregateRepeatsKeepsTheMedianRepeat: one result per case, the median repeat's
// figures, every repeat's ratio kept in run order.
func TestAggregateRepeatsKeepsTheMedianRepeat(t *testing.T) {
	mk := func(rate, r float64) Result {
		return Result{Case: "c", RecordsPerSec: rate, Ratio: r, RatioTo: "b"}
	}
	out := aggregateRepeats([][]Result{{mk(10, 0.9)}, {mk(30, 0.2)}, {mk(20, 0.5)}})
	require.Len(t, out, 1)
	require.Equal(t, 0.5, out[0].Ratio)
	require.Equal(t, 20.0, out[0].RecordsPerSec)
	require.Equal(t, 3, out[0].Repeats)
	require.Equal(t, []float64{0.9, 0.2, 0.5}, out[0].RatioSamples)
	require.Equal(t, []float64{10, 30, 20}, out[0].RateSamples)
}

// TestAggregateRepeatsKeepsPairedResultsTogether: results measured together (Paired)
// come from one repeat, the median of the first of them, not each from its own; the
// others keep their own median.
func TestAggregateRepeatsKeepsPairedResultsTogether(t *testing.T) {
	timed := func(c, paired string, p50, p99 float64) Result {
		return Result{Case: c, Paired: paired, Timing: &Timing{P50: p50, P99: p99, Count: 1}}
	}
	// Repeat by repeat: the baseline's median by p50 is repeat 0, the measured case's
	// (and so the pair's) repeat 2.
	reps := [][]Result{
		{timed("native", "e2e", 2, 10), timed("kafka", "e2e", 1, 30), timed("alone", "", 5, 5)},
		{timed("native", "e2e", 1, 11), timed("kafka", "e2e", 3, 20), timed("alone", "", 7, 7)},
		{timed("native", "e2e", 3, 12), timed("kafka", "e2e", 2, 25), timed("alone", "", 6, 6)},
	}
	out := aggregateRepeats(reps)
	require.Len(t, out, 3)
	// native comes first: its median repeat (p50 2, repeat 0) decides the pair's.
	require.Equal(t, 10.0, out[0].Timing.P99)
	require.Equal(t, 30.0, out[1].Timing.P99, "kafka from the same repeat as native, not its own median (p50 2, p99 25)")
	require.Equal(t, 6.0, out[2].Timing.P99)
	for _, r := range out {
		require.Equal(t, 3, r.Repeats)
	}
}

// TestPairedP99VerdictIsNotOneRepeatsLuck: the Kafka end-to-end verdict over repeats
// must not read "meets" from the one repeat picked by the native case's p50 when the
// Kafka p99 exceeds the native one's by far more than 1 ms in the other repeats.
// pairedE2E is one repeat's three paired end-to-end results, the producers at rate.
func pairedE2E(nP50, nP99, kP99, rate float64) []Result {
	const p = "kafka e2e paired"
	return []Result{
		{Case: e2eCase("kafka-paired-native"), Paired: p, EventRate: rate, Timing: &Timing{P50: nP50, P99: nP99, Count: 1}},
		{Case: e2eCase("kafka-paired-kafka"), Paired: p, EventRate: rate, Timing: &Timing{P50: nP50 + 1, P99: kP99, Count: 1}},
		{Case: e2eCase("kafka-paired-diff"), Paired: p, EventRate: rate, Timing: &Timing{P50: 1, P99: kP99 - nP99, Count: 1}},
	}
}

// targetLine returns the report's one target line that starts with prefix.
func targetLine(t *testing.T, out []Result, prefix string) string {
	var lines []string
	for _, h := range (&Report{Results: out}).headlines() {
		if strings.HasPrefix(h, prefix) {
			lines = append(lines, h)
		}
	}
	require.Len(t, lines, 1)
	return lines[0]
}

// e2eHeadline returns the report's one Kafka end-to-end target line.
func e2eHeadline(t *testing.T, out []Result) string { return targetLine(t, out, "Kafka end to end") }

// TestPairedE2EVerdictNeedsTheRate: the end-to-end target is named at 1,000 events/s;
// a run whose producers committed far fewer (a loaded machine) does not meet it,
// however close the two p99s, and the line says why. The same figures at the rate
// meet it.
func TestPairedE2EVerdictNeedsTheRate(t *testing.T) {
	at := e2eHeadline(t, aggregateRepeats([][]Result{pairedE2E(2, 10, 10.5, 990), pairedE2E(2, 10, 10.4, 995), pairedE2E(2, 10, 10.6, 1000)}))
	require.True(t, strings.Contains(at, ": **meets**"), at)
	slow := e2eHeadline(t, aggregateRepeats([][]Result{pairedE2E(2, 10, 10.5, 300), pairedE2E(2, 10, 10.4, 310), pairedE2E(2, 10, 10.6, 290)}))
	require.True(t, strings.Contains(slow, " (at 310 events/s: the producers did not reach the 900/s the verdict needs): **below**"), slow)
}

func TestPairedP99VerdictIsNotOneRepeatsLuck(t *testing.T) {
	paired := func(nP50, nP99, kP99 float64) []Result { return pairedE2E(nP50, nP99, kP99, latencyRate) }
	// Per repeat, Kafka p99 minus native p99: 0.5, 30, 30 ms. The native p50's median
	// repeat is the first, the one where Kafka was within 1 ms.
	out := aggregateRepeats([][]Result{paired(2, 10, 10.5), paired(1, 20, 50), paired(3, 30, 60)})
	rep := &Report{Results: out}
	stated := 0
	for _, h := range rep.headlines() {
		if strings.HasPrefix(h, "Kafka end to end") {
			require.True(t, strings.HasSuffix(h, "**below**"), h)
			stated++
		}
	}
	require.Equal(t, 1, stated)
}

// latencyHeadline returns the report's one latency target line.
func latencyHeadline(t *testing.T, out []Result) string {
	return targetLine(t, out, "latency, commit → consumer-group handler")
}

// TestLatencyTargetIsMeasuredByTheQuickSuite: the latency target (commit → group
// handler) is stated from the case that the quick suite measures, the kafka
// scenario's sequential group-tailer mode, with the median p50 and p99 of the
// repeats and their spread; not met when the producers fell short of the rate.
func TestLatencyTargetIsMeasuredByTheQuickSuite(t *testing.T) {
	require.Positive(t, QuickSuite().KafkaLatencyDuration, "the quick suite runs the kafka scenario's end-to-end modes")
	rep := func(p50, p99, rate float64) []Result {
		return []Result{{Scenario: "kafka", System: "group-tailer", Case: e2eCase("group-tailer"), Baseline: true, EventRate: rate,
			Timing: &Timing{P50: p50, P99: p99, Count: 4000}}}
	}
	line := latencyHeadline(t, aggregateRepeats([][]Result{rep(0.9, 6.1, 995), rep(0.7, 4.2, 990), rep(0.8, 4.5, 1000)}))
	require.NotContains(t, line, "not measured")
	// Medians 0.8 and 4.5 (the p50's median repeat has p99 4.5 too; the p99s' own
	// median decides).
	require.Contains(t, line, "`"+e2eCase("group-tailer")+"`: p50 0.80 ms (spread 0.70–0.90), p99 4.50 ms (spread 4.20–6.10): the medians of 3 repeats")
	require.True(t, strings.HasSuffix(line, ": **meets**"), line)
	// p99s 6.1, 4.2, 5.5: the median repeat by p50 (0.8) has 4.2, the median p99 is
	// 5.5 — below.
	line = latencyHeadline(t, aggregateRepeats([][]Result{rep(0.9, 6.1, 995), rep(0.8, 4.2, 990), rep(0.7, 5.5, 1000)}))
	require.True(t, strings.HasSuffix(line, ": **below**"), line)
	slow := latencyHeadline(t, aggregateRepeats([][]Result{rep(0.5, 2, 300), rep(0.5, 2, 310), rep(0.5, 2, 290)}))
	require.True(t, strings.HasSuffix(slow, " the verdict needs): **below**"), slow)
}
