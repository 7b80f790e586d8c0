package bench

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"
)

// Latency summarises the duration of one operation of a case, in milliseconds.
type Latency struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
	Mean  float64 `json:"mean_ms"`
	// Hist is a log-scale histogram (8 buckets per decade) of the non-empty buckets,
	// enough to draw the distribution.
	Hist []Bucket `json:"hist,omitempty"`
}

// Bucket counts the operations that took at most LeMs milliseconds (and more than
// the previous bucket's bound).
type Bucket struct {
	LeMs  float64 `json:"le_ms"`
	Count int64   `json:"n"`
}

const bucketsPerDecade = 8

// Timing is what a timing-only case measured: Count samples of one operation, in
// milliseconds.
type Timing struct {
	// Op says what one sample times ("new member's Run to a settled assignment").
	Op    string  `json:"op"`
	Count int64   `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
	Mean  float64 `json:"mean_ms"`
	// Samples are the samples in the order measured, kept when there are at most
	// maxKeptSamples of them (repetitions, not distributions).
	Samples []float64 `json:"samples_ms,omitempty"`
}

const maxKeptSamples = 20

// timing summarises samples of op as a Timing (nil for no samples).
func timing(op string, samples []time.Duration) *Timing {
	if len(samples) == 0 {
		return nil
	}
	var kept []float64
	if len(samples) <= maxKeptSamples {
		for _, d := range samples {
			kept = append(kept, round3(float64(d)/1e6))
		}
	}
	l := summarize(slices.Clone(samples))
	return &Timing{Op: op, Count: l.Count, P50: l.P50, P99: l.P99, Max: l.Max, Mean: l.Mean, Samples: kept}
}

// timingResult is a timing-only result of samples of op.
func timingResult(scenario, system, name string, baseline bool, p Params, op string, samples []time.Duration) Result {
	var sum time.Duration
	for _, d := range samples {
		sum += d
	}
	return Result{Scenario: scenario, Case: name, System: system, Baseline: baseline, Params: p,
		Seconds: round3(sum.Seconds()), Timing: timing(op, samples)}
}

// summarize computes a Latency from raw samples (it sorts them).
func summarize(samples []time.Duration) *Latency {
	if len(samples) == 0 {
		return nil
	}
	slices.Sort(samples)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(samples)))) - 1
		i = min(max(i, 0), len(samples)-1)
		return round3(ms(samples[i]))
	}
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	l := &Latency{
		Count: int64(len(samples)),
		P50:   q(0.50), P90: q(0.90), P99: q(0.99), P999: q(0.999),
		Max:  round3(ms(samples[len(samples)-1])),
		Mean: round3(ms(sum) / float64(len(samples))),
	}
	// Bucket i covers (10^((i-1)/8), 10^(i/8)] microseconds.
	counts := map[int]int64{}
	for _, s := range samples {
		us := max(float64(s)/1e3, 1)
		counts[int(math.Ceil(math.Log10(us)*bucketsPerDecade))]++
	}
	keys := make([]int, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		l.Hist = append(l.Hist, Bucket{LeMs: round3(math.Pow(10, float64(k)/bucketsPerDecade) / 1e3), Count: counts[k]})
	}
	return l
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// opFunc performs operation iter of worker w and returns the records and payload
// bytes it moved.
type opFunc func(ctx context.Context, w, iter int) (records, bytes int, err error)

// loadResult is what runLoad measured.
type loadResult struct {
	records, bytes int64
	elapsed        time.Duration
	latency        *Latency
	// clientCPU and serverCPU are the CPU time spent by this process and by the
	// benchmark's server backends (zero when unknown); see cpu.go.
	clientCPU, serverCPU time.Duration
}

// runLoad runs op on workers goroutines for d (each worker finishes the operation in
// progress at the deadline) and returns the totals. The first error stops all
// workers and is returned.
func runLoad(ctx context.Context, workers int, d time.Duration, op opFunc) (loadResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type workerOut struct {
		records, bytes int64
		samples        []time.Duration
		err            error
	}
	outs := make([]workerOut, workers)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := &outs[w]
			for iter := 0; time.Now().Before(deadline) && ctx.Err() == nil; iter++ {
				t0 := time.Now()
				n, b, err := op(ctx, w, iter)
				if err != nil {
					o.err = err
					cancel()
					return
				}
				o.samples = append(o.samples, time.Since(t0))
				o.records += int64(n)
				o.bytes += int64(b)
			}
		}()
	}
	wg.Wait()
	res := loadResult{elapsed: time.Since(start)}
	var all []time.Duration
	for _, o := range outs {
		if o.err != nil {
			return res, o.err
		}
		res.records += o.records
		res.bytes += o.bytes
		all = append(all, o.samples...)
	}
	res.latency = summarize(all)
	return res, nil
}
