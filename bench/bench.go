// Package bench is streamd's benchmark harness. Every scenario measures streamd and
// its raw-PostgreSQL baseline in the same run, on the same database, and reports the
// ratio between them: produce against COPY, fetch against a primary-key range read.
//
// A scenario is one file (produce.go, fetch.go, profile.go, ...): a type
// implementing Scenario and an init function that calls register with the
// scenario's place in the run order. Scenarios lists them in that order. Run executes a suite (sizes and
// durations) and returns a Report, which report.go prints, stores as JSON, draws as
// SVG and writes into bench/RESULTS.md.
//
// The harness is single-run and single-process: scenarios run one after another, each
// owns the goroutines it starts and waits for them before returning.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/streams"
)

// Scenario is one benchmark: it creates what it needs (fresh streams, baseline
// tables), measures, cleans up and returns its results. Run is called once per run;
// it must stop early when ctx ends and leave no goroutine behind.
type Scenario interface {
	// Name is the scenario's short name ("produce"), used by -scenarios and in tables.
	Name() string
	// Run measures the scenario at env's suite sizes.
	Run(ctx context.Context, env *Env) ([]Result, error)
}

// preflighter is a Scenario that can tell, before the run starts, that it would fail
// for want of something (disk space): Run asks every scenario it will run first, so
// that a late scenario cannot throw away an hour of results.
type preflighter interface {
	preflight(ctx context.Context, env *Env) error
}

// registered is a scenario and its place in the run order.
type registered struct {
	order    int
	scenario Scenario
}

// registry holds the scenarios; written only by init functions.
var registry []registered

// register adds s to the scenarios run by Run, at order (lower runs first; ties run
// in file-name order). Call it from an init function of the scenario's file.
func register(order int, s Scenario) {
	registry = append(registry, registered{order, s})
}

// Scenarios returns every scenario, in run order.
func Scenarios() []Scenario {
	rs := slices.Clone(registry)
	slices.SortStableFunc(rs, func(a, b registered) int { return a.order - b.order })
	out := make([]Scenario, len(rs))
	for i, r := range rs {
		out[i] = r.scenario
	}
	return out
}

// Env is what a scenario runs against.
type Env struct {
	// Pool is the benchmark's pool on the project's PostgreSQL, migrated.
	Pool *pgxpool.Pool
	// Client is a streams.Client on Pool.
	Client *streams.Client
	// Suite holds the sizes to run at.
	Suite Suite
	// RunID is a short random string that makes this run's stream names unique.
	RunID string
	// Logger receives progress lines.
	Logger *slog.Logger
	// Notes collects findings that are not throughput figures (profiles); they go
	// into the report.
	Notes []Note
	// ConsumeCPUProfile, when set, is the file the kafka scenario's consume case
	// writes a CPU profile of its commit-each-poll franz-go group read to (the
	// last repeat's), with the samples labelled side=server (the kafka.Server's
	// goroutines) or side=franz-go (the client's and the bench loop's); unlabelled
	// samples are the runtime's own (the GC's background work). Split with pprof
	// -tagfocus.
	ConsumeCPUProfile string
}

// StreamName returns a fresh stream name for this run.
func (e *Env) StreamName(parts ...string) string {
	return "bench-" + strings.Join(parts, "-") + "-" + e.RunID
}

// AddNote records a finding for the report.
func (e *Env) AddNote(scenario, title, text string) {
	e.Notes = append(e.Notes, Note{Scenario: scenario, Title: title, Text: text})
}

// Note is a finding that is not a throughput figure, such as a per-stage profile.
type Note struct {
	Scenario string `json:"scenario"`
	Title    string `json:"title"`
	Text     string `json:"text"`
}

// Params are the knobs a result was measured at. Zero fields did not apply.
type Params struct {
	PayloadBytes int    `json:"payload_bytes,omitempty"`
	BatchSize    int    `json:"batch_size,omitempty"`
	Conns        int    `json:"conns,omitempty"`
	Partitions   int    `json:"partitions,omitempty"`
	Mode         string `json:"mode,omitempty"`
	// LogEvents is how many events streamd.events already held (the growth scenario).
	LogEvents int64 `json:"log_events,omitempty"`
}

// Result is one measured case, of one of two kinds:
//
//   - throughput (Timing nil): Records and Bytes moved in Seconds, their rates, and
//     the Latency of one operation;
//   - timing-only (Timing set): how long something takes (a rebalance, a view
//     query), with no records moved: Records, Bytes, the rates and Latency are zero.
type Result struct {
	// Scenario is the scenario's name.
	Scenario string `json:"scenario"`
	// Case names the case uniquely within the run ("produce streamd 1KiB b=100 c=4").
	Case string `json:"case"`
	// System is what was measured: "streamd", or a baseline such as "copy".
	System string `json:"system"`
	// Baseline is true for raw-PostgreSQL reference measurements.
	Baseline bool   `json:"baseline,omitempty"`
	Params   Params `json:"params"`
	// Records and Bytes (payload: data plus key) moved in Seconds of wall time. For a
	// timing-only result Seconds is the sum of the timed samples.
	Records       int64   `json:"records,omitempty"`
	Bytes         int64   `json:"bytes,omitempty"`
	Seconds       float64 `json:"seconds"`
	RecordsPerSec float64 `json:"records_per_sec,omitempty"`
	MBPerSec      float64 `json:"mb_per_sec,omitempty"`
	// RatioTo is the Case of the baseline this result is compared with; Ratio is
	// RecordsPerSec divided by the baseline's (for a timing-only result: the
	// baseline's median time divided by this one's, so that above 1 is faster here
	// too), and Target the ratio aimed for.
	RatioTo string  `json:"ratio_to,omitempty"`
	Ratio   float64 `json:"ratio,omitempty"`
	Target  float64 `json:"target,omitempty"`
	// ClientCPUPerRecord and ServerCPUPerRecord are the CPU microseconds per record
	// spent by the benchmark process and by its PostgreSQL backends (0: unknown).
	// CPUBusy is their sum over the wall time and the machine's cores: near 1 means
	// the case was CPU-bound on this machine.
	ClientCPUPerRecord float64 `json:"client_cpu_us_per_record,omitempty"`
	ServerCPUPerRecord float64 `json:"server_cpu_us_per_record,omitempty"`
	CPUBusy            float64 `json:"cpu_busy,omitempty"`
	// Latency is the distribution of one operation (one produce call, one fetch).
	Latency *Latency `json:"latency,omitempty"`
	// Timing, when set, makes this a timing-only result.
	Timing *Timing `json:"timing,omitempty"`
	// Note says anything a reader needs to interpret the figure.
	Note string `json:"note,omitempty"`
	// EventRate is the events per second the producers of a latency case committed
	// (paced at latencyRate; fewer when commits took longer than the pace allows).
	EventRate float64 `json:"event_rate,omitempty"`
	// Repeats is how many times the case was measured (its scenario run again, the
	// baseline back to back with it each time). The figures above are those of the
	// median repeat (by Ratio, or by rate or p50 for a result without one);
	// RatioSamples and RateSamples keep every repeat's, in run order.
	Repeats      int       `json:"repeats,omitempty"`
	RatioSamples []float64 `json:"ratio_samples,omitempty"`
	RateSamples  []float64 `json:"rate_samples,omitempty"`
	// P50Samples and P99Samples keep every repeat's Timing.P50 and Timing.P99, in
	// run order (timing results).
	P50Samples []float64 `json:"p50_samples,omitempty"`
	P99Samples []float64 `json:"p99_samples,omitempty"`
	// Paired names results measured together (the same events, at the same time)
	// that must be compared within one repeat: across repeats all of them are taken
	// from the repeat that is the median of the first of them (in the scenario's
	// order), not each from its own.
	Paired string `json:"paired,omitempty"`
}

// finish computes the rates.
func (r *Result) finish() {
	if r.Seconds > 0 {
		r.RecordsPerSec = float64(r.Records) / r.Seconds
		r.MBPerSec = float64(r.Bytes) / r.Seconds / 1e6
	}
}

// resultRatio is r's ratio to base: throughput over the baseline's, or for two
// timing-only results the baseline's median time over r's.
func resultRatio(r, base Result) float64 {
	if r.Timing != nil && base.Timing != nil {
		return ratio(base.Timing.P50, r.Timing.P50)
	}
	return ratio(r.RecordsPerSec, base.RecordsPerSec)
}

// Options configures Run.
type Options struct {
	// Suite holds the sizes. Required.
	Suite Suite
	// Scenarios names the scenarios to run. Defaults to all.
	Scenarios []string
	// Logger receives progress. Defaults to a logger that discards.
	Logger *slog.Logger
	// ConsumeCPUProfile, when set, is the file the kafka scenario writes a CPU
	// profile of its consume case's commit-each-poll franz-go read to
	// (Env.ConsumeCPUProfile).
	ConsumeCPUProfile string
}

// Run migrates nothing (the caller migrates), runs the scenarios on pool in order and
// returns the report. A failing scenario stops the run with its error.
func Run(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Report, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	env := &Env{
		Pool:   pool,
		Client: streams.NewClient(pool, &streams.ClientConfig{Logger: logger}),
		Suite:  opts.Suite,
		RunID:  randomID(),
		Logger: logger,

		ConsumeCPUProfile: opts.ConsumeCPUProfile,
	}
	rep := &Report{
		Date:  time.Now().UTC(),
		Suite: opts.Suite.Name,
	}
	rep.Machine = machineInfo()
	if rep.Machine.LoadAvgStart > float64(rep.Machine.Cores)/2 {
		logger.Warn("the machine is busy: figures will be noisy", "load_avg", rep.Machine.LoadAvgStart, "cores", rep.Machine.Cores)
	}
	pg, err := postgresInfo(ctx, pool)
	if err != nil {
		return nil, err
	}
	rep.Postgres = pg
	rep.Git = gitInfo(ctx)
	if err := setupBaselineSchema(ctx, pool); err != nil {
		return nil, err
	}
	var run []Scenario
	for _, s := range Scenarios() {
		if len(opts.Scenarios) == 0 || slices.Contains(opts.Scenarios, s.Name()) {
			run = append(run, s)
		}
	}
	for _, s := range run {
		if p, ok := s.(preflighter); ok {
			if err := p.preflight(ctx, env); err != nil {
				return nil, fmt.Errorf("scenario %s: %w", s.Name(), err)
			}
		}
	}
	start := time.Now()
	repeats := max(opts.Suite.Repeats, 1)
	for _, s := range run {
		n := repeats
		if o, ok := s.(runsOnce); ok && o.runsOnce() {
			n = 1
		}
		var reps [][]Result
		for i := 0; i < n; i++ {
			logger.Info("scenario start", "scenario", s.Name(), "repeat", i+1, "of", n)
			t0 := time.Now()
			res, err := s.Run(ctx, env)
			if err != nil {
				return nil, fmt.Errorf("scenario %s: %w", s.Name(), err)
			}
			resolveRatios(res)
			logger.Info("scenario done", "scenario", s.Name(), "results", len(res), "seconds", time.Since(t0).Seconds())
			reps = append(reps, res)
		}
		rep.Results = append(rep.Results, aggregateRepeats(reps)...)
	}
	rep.Seconds = time.Since(start).Seconds()
	rep.Notes = env.Notes
	rep.Machine.LoadAvgEnd = loadAvg()
	return rep, nil
}

// runsOnce is a Scenario that is not repeated (its cost is its setup: loading a
// large log), whatever Suite.Repeats says; its results say Repeats 1.
type runsOnce interface {
	runsOnce() bool
}

// aggregateRepeats merges the results of a scenario's repeats (each repeat's ratios
// already computed against the baseline measured in that repeat): one result per
// case, that of the median repeat, with every repeat's ratio and rate kept.
func aggregateRepeats(reps [][]Result) []Result {
	var order []string
	byCase := map[string][]Result{}
	for _, rs := range reps {
		for _, r := range rs {
			if _, ok := byCase[r.Case]; !ok {
				order = append(order, r.Case)
			}
			byCase[r.Case] = append(byCase[r.Case], r)
		}
	}
	out := make([]Result, 0, len(order))
	pairedRepeat := map[string]int{} // Paired → the repeat its first result took
	for _, c := range order {
		rs := byCase[c]
		key := func(r Result) float64 {
			switch {
			case r.Ratio != 0:
				return r.Ratio
			case r.Timing != nil:
				return -r.Timing.P50 // faster is "higher", as for ratios
			}
			return r.RecordsPerSec
		}
		idx := make([]int, len(rs)) // rs's repeats sorted by key
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int { return cmpFloat(key(rs[a]), key(rs[b])) })
		pick := idx[(len(idx)-1)/2]
		if p := rs[0].Paired; p != "" {
			if i, ok := pairedRepeat[p]; ok && i < len(rs) {
				pick = i
			} else if !ok {
				pairedRepeat[p] = pick
			}
		}
		med := rs[pick]
		med.Repeats = len(rs)
		med.RatioSamples, med.RateSamples, med.P50Samples, med.P99Samples = nil, nil, nil, nil
		for _, r := range rs {
			if r.Timing != nil {
				med.P50Samples = append(med.P50Samples, r.Timing.P50)
				med.P99Samples = append(med.P99Samples, r.Timing.P99)
			}
			if r.Ratio != 0 {
				med.RatioSamples = append(med.RatioSamples, r.Ratio)
			}
			if r.RecordsPerSec != 0 {
				med.RateSamples = append(med.RateSamples, round3(r.RecordsPerSec))
			}
		}
		out = append(out, med)
	}
	return out
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// spread returns the smallest and largest of xs (0, 0 for none).
func spread(xs []float64) (lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	return slices.Min(xs), slices.Max(xs)
}

// Known reports whether name is a scenario.
func Known(name string) bool {
	for _, s := range Scenarios() {
		if s.Name() == name {
			return true
		}
	}
	return false
}

func randomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// resolveRatios fills the ratios that refer to a baseline measured by another
// scenario of the run.
func resolveRatios(rs []Result) {
	for i := range rs {
		if rs[i].RatioTo == "" || rs[i].Ratio != 0 {
			continue
		}
		if base := find(rs, rs[i].RatioTo); base.Case != "" {
			rs[i].Ratio = resultRatio(rs[i], base)
		}
	}
}
