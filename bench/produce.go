package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/streams"
)

// produceScenario measures streams.Client.Produce (one transaction, one
// streamd.append call per batch) against pgx COPY of the same rows into an identical
// table, at several batch sizes, connection counts and partition counts.
//
// Worker w sends its batch i to partition (w + i*workers) mod partitions: with as many
// workers as partitions each worker owns a partition (as a Kafka producer batches per
// partition); with one worker the batches go round the partitions. Mode "spread"
// instead spreads every batch over all partitions, so concurrent batches contend on
// the same head rows.
//
// The reference baseline is COPY with the most connections at the largest batch;
// every streamd case reports its ratio to it (target 0.7 at the suite's partitions).
type produceScenario struct{}

func init() { register(10, produceScenario{}) }

func (produceScenario) Name() string { return "produce" }

// produceTarget is issue 2's goal: streamd produce ≥ 0.7× the 4-connection COPY.
const produceTarget = 0.7

func (s produceScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	su := env.Suite
	conns := maxInt(su.Conns)
	batch := maxInt(su.BatchSizes)
	var out []Result
	for _, size := range su.Payloads {
		var cases []Result
		for _, c := range su.Conns {
			for _, b := range su.BatchSizes {
				p := Params{PayloadBytes: size, BatchSize: b, Conns: c, Partitions: su.Partitions}
				r, err := produceStreamd(ctx, env, p)
				if err != nil {
					return nil, err
				}
				cases = append(cases, r)
				r, err = produceCopy(ctx, env, p)
				if err != nil {
					return nil, err
				}
				cases = append(cases, r)
			}
		}
		ref := fmt.Sprintf("produce copy %s b=%d c=%d p=%d", sizeLabel(size), batch, conns, su.Partitions)
		setRatios(cases, ref, "streamd", produceTarget)
		out = append(out, cases...)
	}

	// Throughput against partitions, and the contended "spread" mode.
	size := su.Payloads[0]
	var sweep []Result
	for _, parts := range su.PartitionSweep {
		p := Params{PayloadBytes: size, BatchSize: su.SweepBatch, Conns: conns, Partitions: parts, Mode: "sweep"}
		r, err := produceStreamd(ctx, env, p)
		if err != nil {
			return nil, err
		}
		rc, err := produceCopy(ctx, env, p)
		if err != nil {
			return nil, err
		}
		r.RatioTo, r.Ratio = rc.Case, ratio(r.RecordsPerSec, rc.RecordsPerSec)
		sweep = append(sweep, r, rc)
	}
	p := Params{PayloadBytes: size, BatchSize: su.SweepBatch, Conns: conns, Partitions: su.Partitions, Mode: "spread"}
	r, err := produceStreamd(ctx, env, p)
	if err != nil {
		return nil, err
	}
	r.Note = "every batch spans all partitions: concurrent batches wait on each other's head-row locks"
	sweep = append(sweep, r)
	ref := fmt.Sprintf("produce copy %s b=%d c=%d p=%d", sizeLabel(size), batch, conns, su.Partitions)
	for i := range sweep {
		if !sweep[i].Baseline && sweep[i].RatioTo == "" {
			sweep[i].RatioTo = ref
			sweep[i].Ratio = ratio(sweep[i].RecordsPerSec, find(out, ref).RecordsPerSec)
		}
	}
	return append(out, sweep...), nil
}

// produceStreamd runs one streamd case on a fresh stream and deletes it afterwards.
func produceStreamd(ctx context.Context, env *Env, p Params) (Result, error) {
	return produceStreamdCase(ctx, env, "produce", "streamd", p, func(ctx context.Context, stream string) error {
		return dropStream(ctx, env, stream)
	})
}

// produceStreamdCase is produceStreamd for scenario, naming the result's system, with
// drop in charge of removing the stream.
func produceStreamdCase(ctx context.Context, env *Env, scenario, system string, p Params,
	drop func(ctx context.Context, stream string) error) (Result, error) {
	stream := env.StreamName("produce", sizeLabel(p.PayloadBytes), fmt.Sprint(p.BatchSize), fmt.Sprint(p.Conns), fmt.Sprint(p.Partitions))
	if err := env.Client.CreateStream(ctx, stream, int32(p.Partitions)); err != nil {
		return Result{}, err
	}
	srcs := make([]*rowSource, p.Conns)
	bufs := make([][]streams.Record, p.Conns)
	for w := range srcs {
		srcs[w] = newRowSource(env, stream, w, p.PayloadBytes)
		bufs[w] = make([]streams.Record, 0, p.BatchSize)
	}
	load, err := env.measure(ctx, p.Conns, env.Suite.CaseDuration, func(ctx context.Context, w, iter int) (int, int, error) {
		part := int32((w + iter*p.Conns) % p.Partitions)
		if p.Mode == "spread" {
			part = -1
		}
		recs, bytes := srcs[w].records(bufs[w], p.BatchSize, part, p.Partitions)
		bufs[w] = recs
		if _, err := env.Client.Produce(ctx, recs...); err != nil {
			return 0, 0, err
		}
		return len(recs), bytes, nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("produce to %s: %w", stream, err)
	}
	// Sanity: the log holds exactly what was acknowledged.
	info, err := env.Client.DescribeStream(ctx, stream)
	if err != nil {
		return Result{}, err
	}
	var stored int64
	for _, pi := range info.PartitionInfo {
		stored += pi.NextOffset
	}
	if stored != load.records {
		return Result{}, fmt.Errorf("produce to %s: %d records acknowledged but the log end offsets sum to %d", stream, load.records, stored)
	}
	if err := drop(ctx, stream); err != nil {
		return Result{}, err
	}
	r := loadToResult(scenario, system, false, p, load)
	env.Logger.Info("case", "case", r.Case, "records_per_sec", int(r.RecordsPerSec))
	return r, nil
}

// produceCopy runs the baseline: the same rows, offsets precomputed, COPY'd into the
// empty baseline table.
func produceCopy(ctx context.Context, env *Env, p Params) (Result, error) {
	if err := truncateCopy(ctx, env.Pool); err != nil {
		return Result{}, err
	}
	clean := func(ctx context.Context, _ string) error { return truncateCopy(ctx, env.Pool) }
	mode := p.Mode
	p.Mode = ""
	r, err := produceCopyCase(ctx, env, "produce", "copy", p, copyTable, clean)
	r.Params.Mode = mode
	return r, err
}

// produceCopyCase runs a baseline case of scenario into table, which holds no rows of
// the case's stream, and then calls clean with that stream's name.
func produceCopyCase(ctx context.Context, env *Env, scenario, system string, p Params, table pgx.Identifier,
	clean func(ctx context.Context, stream string) error) (Result, error) {
	stream := env.StreamName("produce", sizeLabel(p.PayloadBytes), fmt.Sprint(p.BatchSize), fmt.Sprint(p.Conns), fmt.Sprint(p.Partitions))
	next := make([]atomic.Int64, p.Partitions)
	srcs := make([]*rowSource, p.Conns)
	bufs := make([][][]any, p.Conns)
	for w := range srcs {
		srcs[w] = newRowSource(env, stream, w, p.PayloadBytes)
		bufs[w] = make([][]any, 0, p.BatchSize)
	}
	load, err := env.measure(ctx, p.Conns, env.Suite.CaseDuration, func(ctx context.Context, w, iter int) (int, int, error) {
		part := (w + iter*p.Conns) % p.Partitions
		base := next[part].Add(int64(p.BatchSize)) - int64(p.BatchSize)
		rows, bytes := srcs[w].copyRows(bufs[w], p.BatchSize, int32(part), base, time.Now())
		bufs[w] = rows
		if err := copyBatchInto(ctx, env.Pool, table, rows); err != nil {
			return 0, 0, err
		}
		return len(rows), bytes, nil
	})
	if err != nil {
		return Result{}, err
	}
	if err := clean(context.WithoutCancel(ctx), stream); err != nil {
		return Result{}, err
	}
	r := loadToResult(scenario, system, true, p, load)
	env.Logger.Info("case", "case", r.Case, "records_per_sec", int(r.RecordsPerSec))
	return r, nil
}

// loadToResult names a case and turns a load measurement into a Result.
func loadToResult(scenario, system string, baseline bool, p Params, l loadResult) Result {
	name := fmt.Sprintf("%s %s %s", scenario, system, sizeLabel(p.PayloadBytes))
	if p.BatchSize > 0 {
		name += fmt.Sprintf(" b=%d", p.BatchSize)
	}
	if p.Conns > 0 {
		name += fmt.Sprintf(" c=%d", p.Conns)
	}
	if p.Partitions > 0 {
		name += fmt.Sprintf(" p=%d", p.Partitions)
	}
	if p.Mode != "" {
		name += " " + p.Mode
	}
	r := Result{
		Scenario: scenario, Case: name, System: system, Baseline: baseline, Params: p,
		Records: l.records, Bytes: l.bytes, Seconds: l.elapsed.Seconds(), Latency: l.latency,
	}
	r.finish()
	if l.records > 0 {
		r.ClientCPUPerRecord = round3(float64(l.clientCPU.Microseconds()) / float64(l.records))
		r.ServerCPUPerRecord = round3(float64(l.serverCPU.Microseconds()) / float64(l.records))
	}
	if l.elapsed > 0 {
		r.CPUBusy = round3((l.clientCPU + l.serverCPU).Seconds() / l.elapsed.Seconds() / float64(runtime.NumCPU()))
	}
	return r
}

// setRatios sets, on every result of system, the ratio to the result named ref.
func setRatios(rs []Result, ref, system string, target float64) {
	base := find(rs, ref)
	for i := range rs {
		if rs[i].System == system {
			rs[i].RatioTo = ref
			rs[i].Ratio = ratio(rs[i].RecordsPerSec, base.RecordsPerSec)
			rs[i].Target = target
		}
	}
}

func find(rs []Result, name string) Result {
	for _, r := range rs {
		if r.Case == name {
			return r
		}
	}
	return Result{}
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return round3(a / b)
}

func sizeLabel(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%dKiB", n/1024)
	}
	return fmt.Sprintf("%dB", n)
}
