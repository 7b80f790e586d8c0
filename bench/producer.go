package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/streams"
)

// producerScenario measures the batching streams.Producer with its default
// configuration: many goroutines each calling Produce (which blocks until the
// record's batch committed), and one goroutine calling ProduceAsync as fast as the
// producer's buffer admits. Records carry keys and no partition, so the producer
// routes them by key over the suite's partitions. Latency is per record: from the
// call to the commit being reported.
//
// Ratios are to a COPY reference measured in this scenario, back to back with the
// producer's cases: the produce scenario's reference shape (the suite's largest batch
// and connection count, its partitions), once before the payload size's producer
// cases and once after; the result is the pair's mean rate, so that a drift of the
// machine during the cases hits the reference alike.
type producerScenario struct{}

func init() { register(20, producerScenario{}) }

func (producerScenario) Name() string { return "producer" }

func (s producerScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	su := env.Suite
	var out []Result
	for _, size := range su.Payloads {
		p := Params{PayloadBytes: size, BatchSize: maxInt(su.BatchSizes), Conns: maxInt(su.Conns), Partitions: su.Partitions}
		before, err := producerCopyRef(ctx, env, p)
		if err != nil {
			return nil, err
		}
		var cases []Result
		for _, callers := range su.ProducerCallers {
			r, err := s.sync(ctx, env, size, callers)
			if err != nil {
				return nil, err
			}
			cases = append(cases, r)
		}
		r, err := s.async(ctx, env, size)
		if err != nil {
			return nil, err
		}
		cases = append(cases, r)
		after, err := producerCopyRef(ctx, env, p)
		if err != nil {
			return nil, err
		}
		ref := mergeRuns(before, after)
		ref.Note = fmt.Sprintf("COPY at the produce reference's shape, measured before (%.0f records/s) and after (%.0f records/s) this size's producer cases; the mean of the two",
			before.RecordsPerSec, after.RecordsPerSec)
		for i := range cases {
			cases[i].RatioTo, cases[i].Ratio, cases[i].Target = ref.Case, ratio(cases[i].RecordsPerSec, ref.RecordsPerSec), produceTarget
		}
		out = append(out, cases...)
		out = append(out, ref)
	}
	return out, nil
}

// producerCopyRef measures the producer scenario's own COPY reference at p.
func producerCopyRef(ctx context.Context, env *Env, p Params) (Result, error) {
	return copyRef(ctx, env, "producer", p)
}

// copyRef measures a COPY reference of scenario at p into the empty baseline
// table, named "<scenario> copy-ref ...".
func copyRef(ctx context.Context, env *Env, scenario string, p Params) (Result, error) {
	if err := truncateCopy(ctx, env.Pool); err != nil {
		return Result{}, err
	}
	clean := func(ctx context.Context, _ string) error { return truncateCopy(ctx, env.Pool) }
	return produceCopyCase(ctx, env, scenario, "copy-ref", p, copyTable, clean)
}

// mergeRuns adds two measurements of one case up: records, bytes, time and CPU, so
// that the rates are those of both runs together.
func mergeRuns(a, b Result) Result {
	out := a
	out.Records += b.Records
	out.Bytes += b.Bytes
	out.Seconds += b.Seconds
	out.finish()
	if out.Records > 0 {
		out.ClientCPUPerRecord = round3((a.ClientCPUPerRecord*float64(a.Records) + b.ClientCPUPerRecord*float64(b.Records)) / float64(out.Records))
		out.ServerCPUPerRecord = round3((a.ServerCPUPerRecord*float64(a.Records) + b.ServerCPUPerRecord*float64(b.Records)) / float64(out.Records))
	}
	out.CPUBusy = round3((a.CPUBusy*a.Seconds + b.CPUBusy*b.Seconds) / max(out.Seconds, 1e-9))
	// Latency stays the first run's: a distribution cannot be merged from summaries.
	return out
}

// newProducer returns a producer with the defaults and a fresh stream for it.
// The registry is the producer's own, read for the batch sizes it formed.
func (producerScenario) setup(ctx context.Context, env *Env, name string) (*streams.Producer, *prometheus.Registry, string, error) {
	stream := env.StreamName("producer", name)
	if err := env.Client.CreateStream(ctx, stream, int32(env.Suite.Partitions)); err != nil {
		return nil, nil, "", err
	}
	reg := prometheus.NewRegistry()
	p, err := streams.NewProducer(env.Pool, &streams.ProducerConfig{Registerer: reg})
	if err != nil {
		return nil, nil, "", err
	}
	return p, reg, stream, nil
}

// meanBatch returns the records per committed batch from the producer's metrics.
func meanBatch(reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var records, batches float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "streamd_producer_records_total":
				records += m.GetCounter().GetValue()
			case "streamd_producer_batches_total":
				batches += m.GetCounter().GetValue()
			}
		}
	}
	if batches == 0 {
		return 0
	}
	return records / batches
}

// finish closes the producer, checks the log holds what was acknowledged and drops
// the stream.
func (producerScenario) finish(ctx context.Context, env *Env, p *streams.Producer, stream string, acked int64) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := p.Close(cctx); err != nil {
		return fmt.Errorf("close producer: %w", err)
	}
	info, err := env.Client.DescribeStream(ctx, stream)
	if err != nil {
		return err
	}
	var stored int64
	for _, pi := range info.PartitionInfo {
		stored += pi.NextOffset
	}
	if stored < acked {
		return fmt.Errorf("producer to %s: %d records acknowledged but the log end offsets sum to %d", stream, acked, stored)
	}
	return dropStream(ctx, env, stream)
}

func (s producerScenario) sync(ctx context.Context, env *Env, size, callers int) (Result, error) {
	p, reg, stream, err := s.setup(ctx, env, fmt.Sprintf("%s-%d", sizeLabel(size), callers))
	if err != nil {
		return Result{}, err
	}
	srcs := make([]*rowSource, callers)
	for w := range srcs {
		srcs[w] = newRowSource(env, stream, w, size)
	}
	load, err := env.measure(ctx, callers, env.Suite.CaseDuration, func(ctx context.Context, w, _ int) (int, int, error) {
		r, b := srcs[w].next()
		_, err := p.Produce(ctx, streams.Record{Stream: stream, Key: r.key, EventID: r.eventID, EventType: "bench", Data: r.data})
		if err != nil {
			return 0, 0, err
		}
		return 1, b, nil
	})
	if err != nil {
		_ = p.Close(context.WithoutCancel(ctx))
		return Result{}, fmt.Errorf("producer to %s: %w", stream, err)
	}
	if err := s.finish(ctx, env, p, stream, load.records); err != nil {
		return Result{}, err
	}
	r := loadToResult("producer", "streamd-producer", false, Params{PayloadBytes: size, Conns: callers, Partitions: env.Suite.Partitions, Mode: "sync"}, load)
	r.Params.BatchSize = int(meanBatch(reg) + 0.5)
	r.Note = fmt.Sprintf("%d goroutines calling Producer.Produce; default config (MaxInFlight 4, MaxBatchRecords 1000, Linger 0); mean batch %.1f records", callers, meanBatch(reg))
	env.Logger.Info("case", "case", r.Case, "records_per_sec", int(r.RecordsPerSec))
	return r, nil
}

func (s producerScenario) async(ctx context.Context, env *Env, size int) (Result, error) {
	p, reg, stream, err := s.setup(ctx, env, sizeLabel(size)+"-async")
	if err != nil {
		return Result{}, err
	}
	src := newRowSource(env, stream, 0, size)
	var (
		mu       sync.Mutex
		samples  []time.Duration
		firstErr error
		acked    atomic.Int64
		bytes    atomic.Int64
	)
	failed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return firstErr
	}
	cpu0 := sampleCPU(ctx, env)
	start := time.Now()
	deadline := start.Add(env.Suite.CaseDuration)
	for time.Now().Before(deadline) && ctx.Err() == nil && failed() == nil {
		// Check the clock every 100 records: time.Now per record costs more than
		// enqueueing one.
		for i := 0; i < 100; i++ {
			r, b := src.next()
			t0 := time.Now()
			p.ProduceAsync(ctx, streams.Record{Stream: stream, Key: r.key, EventID: r.eventID, EventType: "bench", Data: r.data},
				func(_ streams.Position, err error) {
					if err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						return
					}
					d := time.Since(t0)
					acked.Add(1)
					bytes.Add(int64(b))
					mu.Lock()
					samples = append(samples, d)
					mu.Unlock()
				})
		}
	}
	if err := p.Flush(ctx); err != nil {
		return Result{}, err
	}
	elapsed := time.Since(start)
	if err := failed(); err != nil {
		_ = p.Close(context.WithoutCancel(ctx))
		return Result{}, fmt.Errorf("producer to %s: %w", stream, err)
	}
	if err := s.finish(ctx, env, p, stream, acked.Load()); err != nil {
		return Result{}, err
	}
	mu.Lock()
	lat := summarize(samples)
	mu.Unlock()
	load := loadResult{records: acked.Load(), bytes: bytes.Load(), elapsed: elapsed, latency: lat}
	load.clientCPU, load.serverCPU = cpuSince(ctx, env, cpu0)
	r := loadToResult("producer", "streamd-producer", false, Params{PayloadBytes: size, Conns: 1, Partitions: env.Suite.Partitions, Mode: "async"}, load)
	r.Params.BatchSize = int(meanBatch(reg) + 0.5)
	r.Note = fmt.Sprintf("one goroutine calling Producer.ProduceAsync, bounded by MaxBufferedRecords (100000); includes the final Flush; latency is enqueue to commit callback; mean batch %.1f records", meanBatch(reg))
	env.Logger.Info("case", "case", r.Case, "records_per_sec", int(r.RecordsPerSec))
	return r, nil
}
