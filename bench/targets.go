package bench

import (
	"fmt"
	"slices"
)

// A target is one goal of the project, measured at the one configuration it names
// and compared with a baseline measured back to back with it in the same scenario.
// The headline ("Targets" in the report) states every target this way, with the
// median and the spread of the repeats; the best case of the same scenario and
// system may be shown beside it, labelled as such, never in its place.
type target struct {
	// Goal says what is promised, in words.
	Goal string
	// Case is the measured case, named exactly as the scenario names it.
	Case string
	// Baseline is the case it is compared with (throughput targets), measured in
	// the same scenario run; empty for an absolute timing target.
	Baseline string
	// Min is the lowest acceptable ratio Case/Baseline (records/s over records/s).
	Min float64
	// MaxP50Ms and MaxP99Ms bound a timing-only case's p50 and p99 (0: no bound).
	MaxP50Ms, MaxP99Ms float64
	// MaxP99OverMs bounds a timing-only case's p99 by its Baseline's p99 plus this
	// many milliseconds (0: no such bound; then Baseline must be empty for a timing
	// target).
	MaxP99OverMs float64
	// Diff is the case of the per-event difference Case − Baseline, when the two
	// were measured on the same events (paired); its p50 and p99 are stated beside.
	Diff string
	// Alone is the baseline's case measured on its own (in other seconds, without
	// Case beside it): stated beside, so that a reader sees what running Case at the
	// same time did to the baseline.
	Alone string
	// MinEventRate is the rate (events/s) the producers of a timing case must have
	// reached for its verdict to stand: a target named at a rate is not met at a
	// lower one (0: no bound).
	MinEventRate float64
	// Scenario and System select the cases that may be shown as the best case.
	Scenario, System string
}

// targets lists every goal, in the order the report states them. Cases that the
// suite did not measure are reported as such.
func targets() []target {
	var ts []target
	for _, size := range []string{"100B", "1KiB"} {
		ts = append(ts, target{
			Goal:     "produce " + size + ": `Client.Produce`, 4 connections, batches of 1000, 4 partitions ≥ 0.7× COPY of the same rows at the same shape",
			Case:     "produce streamd " + size + " b=1000 c=4 p=4",
			Baseline: "produce copy " + size + " b=1000 c=4 p=4",
			Min:      produceTarget, Scenario: "produce", System: "streamd",
		})
	}
	for _, size := range []string{"100B", "1KiB"} {
		ts = append(ts, target{
			Goal:     "producer " + size + ": the batching `Producer` with its defaults, 256 goroutines blocking on `Produce`, keyed over 4 partitions ≥ 0.7× the COPY reference measured in the same scenario",
			Case:     "producer streamd-producer " + size + " c=256 p=4 sync",
			Baseline: "producer copy-ref " + size + " b=1000 c=4 p=4",
			Min:      produceTarget, Scenario: "producer", System: "streamd-producer",
		})
	}
	for _, size := range []string{"100B", "1KiB"} {
		ts = append(ts, target{
			Goal:     "fetch " + size + ": `Client.Fetch` of 500 records from one partition ≥ 0.7× the raw primary-key range read",
			Case:     "fetch streamd " + size + " b=500 c=1 p=1",
			Baseline: "fetch raw-select " + size + " b=500 c=1 p=1",
			Min:      fetchTarget, Scenario: "fetch", System: "streamd",
		})
	}
	ts = append(ts,
		target{
			Goal:     "consumer group, 1 group: one `Consumer` reading 4 partitions (commits asynchronous, every 100 ms) ≥ 0.8× 4 raw range readers; both from the moment each of their partitions had its first batch (steady state; the start-up, Run to then, is the case `... join` under Timings)",
			Case:     "consume consume-group 100B b=500 c=4 p=4 auto-commit",
			Baseline: "consume raw-select 100B b=500 c=4 p=4",
			Min:      consumeTarget, Scenario: "consume", System: "consume-group",
		},
		target{
			Goal:     "consumer groups, 5 groups: five `Consumer`s reading the stream at once ≥ 0.8× five sets of raw readers; both from the moment every partition of every group (every reader) had its first batch (steady state; start-ups under Timings)",
			Case:     "consume consume-5-groups 100B b=500 c=20 p=4 auto-commit",
			Baseline: "consume raw-select-5x 100B b=500 c=20 p=4",
			Min:      consumeTarget, Scenario: "consume", System: "consume-5-groups",
		})
	for _, w := range []int{1, 4, 16} {
		ts = append(ts, target{
			Goal:     fmt.Sprintf("queue, %d worker(s): send, then `Receive` (100) + `Ack` ≥ 0.5× the raw SKIP LOCKED drain", w),
			Case:     fmt.Sprintf("queue streamd b=100 w=%d", w),
			Baseline: fmt.Sprintf("queue raw-skip-locked b=100 w=%d", w),
			Min:      queueTarget, Scenario: "queue", System: "streamd",
		})
	}
	for _, w := range []int{1, 4, 16} {
		ts = append(ts, target{
			Goal:     fmt.Sprintf("queue against pgmq, %d worker(s): send, then `Receive` (100) + `Ack` ≥ 1.0× the pgmq-style batched loop", w),
			Case:     fmt.Sprintf("queue streamd b=100 w=%d", w),
			Baseline: fmt.Sprintf("queue pgmq-batched b=100 w=%d", w),
			Min:      1.0, Scenario: "queue", System: "streamd",
		})
	}
	ts = append(ts,
		target{
			// The kafka scenario's sequential group-tailer case is the latency
			// scenario's group-tailer mode (latencyScenario.run, the same producers,
			// consumer and wake-ups), which the quick suite runs only there; it is
			// read in every suite, so that the line has the suite's repeats.
			Goal: "latency, commit → consumer-group handler, tailer wake-ups, 1,000 events/s, fsync on: p50 ≤ 1 ms, p99 ≤ 5 ms " +
				"(the latency scenario's group-tailer mode, as the kafka scenario runs it alone after its paired mode: in every suite, repeated)",
			Case:         e2eCase("group-tailer"),
			MinEventRate: 0.9 * latencyRate,
			MaxP50Ms:     1, MaxP99Ms: 5, Scenario: "kafka", System: "group-tailer",
		},
		target{
			Goal:     "rebalance: a member joining a group of one settles (every partition owned, balanced) in well under a second: p50 ≤ 1000 ms",
			Case:     fmt.Sprintf("rebalance join 1→2 p=%d", rebalancePartitions),
			MaxP50Ms: 1000, Scenario: "rebalance", System: "streamd",
		},
		target{
			Goal:     "rebalance: a killed member's partitions are owned again within a second of its session timeout: p50 ≤ 1000 ms past it",
			Case:     fmt.Sprintf("rebalance kill 3→2 p=%d", rebalancePartitions),
			MaxP50Ms: 1000, Scenario: "rebalance", System: "streamd",
		})
	for _, codec := range []string{"none", "lz4"} {
		ts = append(ts, target{
			Goal:     "Kafka produce, " + codec + ": franz-go, batches of 1000, 4 goroutines on one client, 4 partitions ≥ 0.8× the batching `Producer` at its own best (one caller, ProduceAsync, as franz-go batches) in the same run",
			Case:     "kafka kgo-" + codec + " 100B b=1000 c=4 p=4",
			Baseline: "kafka streamd-producer 100B c=1 p=4 async",
			Min:      kafkaTarget, Scenario: "kafka", System: "kgo-" + codec,
		})
	}
	ts = append(ts,
		target{
			Goal: "Kafka consume: one franz-go group consumer reading 4 partitions, committing as the `Consumer` does (franz-go's autocommit every 100 ms: asynchronous, at most every 100 ms) ≥ 0.8× one `Consumer`; both from the moment each of their partitions had returned records (steady state; start-ups in the cases' notes). " +
				"Until session 16 the case committed synchronously after every poll, a policy the native side does not have; it stays as the extra line `kafka kgo-group 100B c=1 p=4 commit-each-poll`",
			Case:     "kafka kgo-group 100B c=1 p=4 auto-commit",
			Baseline: "kafka consume-group 100B b=500 c=4 p=4 auto-commit",
			Min:      kafkaTarget, Scenario: "kafka", System: "kgo-group",
		},
		target{
			Goal: fmt.Sprintf("Kafka end to end, commit → franz-go group consumer through the tailer, %d events/s: p99 within 1 ms of the native group consumer's, "+
				"both reading the same events at the same time (paired)", latencyRate),
			Case:         e2eCase("kafka-paired-kafka"),
			Baseline:     e2eCase("kafka-paired-native"),
			Diff:         e2eCase("kafka-paired-diff"),
			Alone:        e2eCase("group-tailer"),
			MinEventRate: 0.9 * latencyRate,
			MaxP99OverMs: 1, Scenario: "kafka", System: "kafka-paired-kafka",
		})
	return ts
}

// consumeTarget is issue 21's goal for consumer groups: 0.8× the raw range read.
const consumeTarget = 0.8

// pairedRatios returns the ratio of c to base for each repeat, pairing the repeats
// in run order (both were measured in the same scenario run each time). Results
// without per-repeat rates (reports written before repeats existed) give their one
// ratio of rates.
func pairedRatios(c, base Result) []float64 {
	if len(c.RateSamples) > 0 && len(c.RateSamples) == len(base.RateSamples) {
		out := make([]float64, len(c.RateSamples))
		for i := range out {
			out[i] = ratio(c.RateSamples[i], base.RateSamples[i])
		}
		return out
	}
	if r := ratio(c.RecordsPerSec, base.RecordsPerSec); r > 0 {
		return []float64{r}
	}
	return nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// headlines states every target: measured at its configuration, or not measured in
// this run.
func (r *Report) headlines() []string {
	var out []string
	for _, t := range targets() {
		out = append(out, r.headline(t))
	}
	return out
}

func (r *Report) headline(t target) string {
	c := find(r.Results, t.Case)
	if c.Case == "" {
		return fmt.Sprintf("%s — **not measured in this run** (no case `%s`)", t.Goal, t.Case)
	}
	if t.MaxP99OverMs > 0 {
		return r.p99Headline(t, c)
	}
	if t.Baseline == "" {
		tm := c.Timing
		if tm == nil && c.Latency != nil {
			tm = &Timing{P50: c.Latency.P50, P99: c.Latency.P99, Count: c.Latency.Count}
		}
		if tm == nil {
			return fmt.Sprintf("%s — `%s` has no timing", t.Goal, t.Case)
		}
		// Over repeats, the verdict is on the median p50 and the median p99 of the
		// repeats, each stated with its spread.
		p50, p99 := tm.P50, tm.P99
		figures := fmt.Sprintf("p50 %s ms, p99 %s ms over %d sample(s)%s", msText(p50), msText(p99), tm.Count, repeatsText(c))
		if len(c.P50Samples) > 1 && len(c.P50Samples) == len(c.P99Samples) {
			p50, p99 = median(c.P50Samples), median(c.P99Samples)
			lo50, hi50 := spread(c.P50Samples)
			lo99, hi99 := spread(c.P99Samples)
			figures = fmt.Sprintf("p50 %s ms (spread %s–%s), p99 %s ms (spread %s–%s): the medians of %d repeats of about %d sample(s)",
				msText(p50), msText(lo50), msText(hi50), msText(p99), msText(lo99), msText(hi99), len(c.P50Samples), tm.Count)
		}
		rate, fast := rateShortfall(t, c)
		ok := fast && (t.MaxP50Ms == 0 || p50 <= t.MaxP50Ms) && (t.MaxP99Ms == 0 || p99 <= t.MaxP99Ms)
		return fmt.Sprintf("%s — `%s`: %s%s: **%s**", t.Goal, t.Case, figures, rate, verdict(ok))
	}
	base := find(r.Results, t.Baseline)
	if base.Case == "" {
		return fmt.Sprintf("%s — `%s` measured, but not its baseline `%s`", t.Goal, t.Case, t.Baseline)
	}
	rs := pairedRatios(c, base)
	if len(rs) == 0 {
		return fmt.Sprintf("%s — no ratio (`%s` or `%s` moved nothing)", t.Goal, t.Case, t.Baseline)
	}
	m := median(rs)
	lo, hi := spread(rs)
	line := fmt.Sprintf("%s — `%s` %.0f records/s = **%.2f×** `%s`", t.Goal, t.Case, c.RecordsPerSec, m, t.Baseline)
	if len(rs) > 1 {
		line += fmt.Sprintf(" (median of %d repeats, spread %.2f–%.2f)", len(rs), lo, hi)
	}
	line += fmt.Sprintf(": **%s**", verdict(m >= t.Min))
	if b := r.bestCase(t); b.Case != "" && b.Case != t.Case && b.Ratio > m {
		line += fmt.Sprintf("; best case, another configuration, for comparison only: `%s` %.2f× `%s`", b.Case, b.Ratio, b.RatioTo)
	}
	return line
}

// rateShortfall says, when c's producers fell short of the rate t is named at, by how
// much (and false: the verdict cannot be met); else "" and true.
func rateShortfall(t target, c Result) (string, bool) {
	if t.MinEventRate > 0 && c.EventRate < t.MinEventRate {
		return fmt.Sprintf(" (at %.0f events/s: the producers did not reach the %.0f/s the verdict needs)", c.EventRate, t.MinEventRate), false
	}
	return "", true
}

// p99Headline states a target that bounds c's p99 by its baseline's plus a margin.
func (r *Report) p99Headline(t target, c Result) string {
	base := find(r.Results, t.Baseline)
	if c.Timing == nil || base.Timing == nil {
		return fmt.Sprintf("%s — `%s` or its baseline `%s` has no timing", t.Goal, t.Case, t.Baseline)
	}
	// Over repeats, the verdict is the median of each repeat's own margin (the two
	// p99s of the same seconds), not the margin of the one repeat shown.
	over := []float64{c.Timing.P99 - base.Timing.P99}
	if len(c.P99Samples) > 1 && len(c.P99Samples) == len(base.P99Samples) {
		over = over[:0]
		for i := range c.P99Samples {
			over = append(over, c.P99Samples[i]-base.P99Samples[i])
		}
	}
	ok := median(over) <= t.MaxP99OverMs
	diff := ""
	if d := find(r.Results, t.Diff); t.Diff != "" && d.Timing != nil {
		diff = fmt.Sprintf("; per event (`%s`): p50 %s ms, p99 %s ms", t.Diff, msText(d.Timing.P50), msText(d.Timing.P99))
	}
	if a := find(r.Results, t.Alone); t.Alone != "" && a.Timing != nil {
		diff += fmt.Sprintf("; the baseline alone, in other seconds (`%s`): p50 %s ms, p99 %s ms", t.Alone, msText(a.Timing.P50), msText(a.Timing.P99))
	}
	rate, fast := rateShortfall(t, c)
	ok = ok && fast
	return fmt.Sprintf("%s — `%s`: p50 %s ms, p99 %s ms; `%s`: p50 %s ms, p99 %s ms%s%s%s: **%s**",
		t.Goal, t.Case, msText(c.Timing.P50), msText(c.Timing.P99), t.Baseline, msText(base.Timing.P50), msText(base.Timing.P99),
		diff, p99OverText(c, over), rate, verdict(ok))
}

// p99OverText states the per-repeat p99 margins behind a p99 verdict.
func p99OverText(c Result, over []float64) string {
	if len(over) < 2 {
		return repeatsText(c)
	}
	lo, hi := spread(over)
	return fmt.Sprintf(", shown: the pair's repeat; p99 over the baseline's: median %s ms of %d repeats (%s–%s)",
		msText(median(over)), len(over), msText(lo), msText(hi))
}

// bestCase is the result of t's scenario and system with the highest ratio.
func (r *Report) bestCase(t target) Result {
	var best Result
	for _, res := range r.Results {
		if res.Scenario == t.Scenario && res.System == t.System && res.Ratio > best.Ratio && res.Timing == nil {
			best = res
		}
	}
	return best
}

func verdict(ok bool) string {
	if ok {
		return "meets"
	}
	return "below"
}

func repeatsText(r Result) string {
	if r.Repeats > 1 {
		return fmt.Sprintf(", median of %d repeats", r.Repeats)
	}
	return ""
}

// ratioSpreadText is a result's ratio with the spread of its repeats.
func ratioSpreadText(r Result) string {
	t := ratioText(r)
	if t == "-" || len(r.RatioSamples) < 2 {
		return t
	}
	lo, hi := spread(r.RatioSamples)
	return t + fmt.Sprintf(" [%.2f–%.2f]", lo, hi)
}
