package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/kafka"
	"github.com/streamd/streamd/wakeup"
)

// kafkaScenario measures the Kafka front door (issue 19, package kafka) against
// streamd's own paths, in the same run, with franz-go as the Kafka client and an
// in-process kafka.Server on loopback over the benchmark's pool:
//
//   - produce: franz-go (ProduceSync of batches of the suite's largest batch size,
//     one client, the suite's largest connection count of goroutines, records
//     spread over the partitions by hand), uncompressed and lz4, against the
//     batching streams.Producer at its own best (the producer scenario's async
//     case: one caller, ProduceAsync; its sync case at 256 callers kept 256 records
//     in flight against franz-go's 4,000 and flattered the ratio) and the COPY
//     reference at the same shape;
//   - consume: a franz-go group consumer (classic protocol, range assignor) reading a
//     pre-filled stream of 4 partitions from the start to the end, against one
//     consumergroup.Consumer (asynchronous commits, at most every 100 ms) and the
//     raw range read, as in the consume scenario; each rate from the moment every
//     partition returned records (steadyWindow), the start-up reported beside it.
//     Twice: with franz-go's autocommit every 100 ms, the native policy (the
//     target's case since session 16), and committing synchronously after every
//     poll (the target's case before);
//   - end to end (with Suite.KafkaLatencyDuration and wal_level=logical): commit →
//     franz-go group consumer at 1,000 events/s, woken through the tailer like the
//     native consumer of the latency scenario's group-tailer mode: both consumers
//     reading the same events at the same time (paired, the target's cases), and
//     then one after the other (sequential, as before session 13); see endToEnd.
//
// The server runs in the benchmark's process: its CPU counts as the client's. It
// reads over the benchmark's pool, except in the end-to-end mode, where it has a
// pool of its own as the native consumer has.
type kafkaScenario struct{}

// After consume and queue, before rebalance.
func init() { register(57, kafkaScenario{}) }

func (kafkaScenario) Name() string { return "kafka" }

// kafkaTarget is issue 19's goal for Kafka produce and consume: 0.8× the native path.
const kafkaTarget = 0.8

func (s kafkaScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	addr, stop, err := startKafkaServer(ctx, env, env.Pool, nil)
	if err != nil {
		return nil, err
	}
	defer stop()

	su := env.Suite
	const size = 100
	p := Params{PayloadBytes: size, BatchSize: maxInt(su.BatchSizes), Conns: maxInt(su.Conns), Partitions: su.Partitions}
	ref, err := copyRef(ctx, env, "kafka", p)
	if err != nil {
		return nil, err
	}
	native, err := producerScenario{}.async(ctx, env, size)
	if err != nil {
		return nil, err
	}
	native.Scenario, native.Case = "kafka", "kafka "+strings.TrimPrefix(native.Case, "producer ")
	native.RatioTo, native.Ratio = ref.Case, ratio(native.RecordsPerSec, ref.RecordsPerSec)
	out := []Result{ref, native}
	for _, codec := range []string{"none", "lz4"} {
		r, err := s.produce(ctx, env, addr, codec, p)
		if err != nil {
			return nil, fmt.Errorf("kafka produce %s: %w", codec, err)
		}
		r.RatioTo, r.Ratio, r.Target = native.Case, ratio(r.RecordsPerSec, native.RecordsPerSec), kafkaTarget
		out = append(out, r)
	}

	rs, err := s.consume(ctx, env, addr)
	if err != nil {
		return nil, err
	}
	out = append(out, rs...)

	rs, err = s.endToEnd(ctx, env)
	if err != nil {
		return nil, err
	}
	return append(out, rs...), nil
}

// startKafkaServer serves Kafka on a loopback port of its own over pool, under a
// listener name of this run's (so Metadata names only this server), until stop is
// called.
func startKafkaServer(ctx context.Context, env *Env, pool *pgxpool.Pool, hub *wakeup.Hub) (addr string, stop func(), err error) {
	srv, err := kafka.New(pool, &kafka.Config{Listener: "bench-" + env.RunID, Logger: quietLogger, Wakeups: hub})
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	// Its goroutines carry side=server in CPU profiles (Env.ConsumeCPUProfile).
	go pprof.Do(sctx, pprof.Labels("side", "server"), func(ctx context.Context) { done <- srv.Serve(ctx, ln) }) // owner: stop, which ends and waits for it
	return ln.Addr().String(), func() { cancel(); <-done }, nil
}

// produce measures franz-go producing batches to a fresh stream.
func (kafkaScenario) produce(ctx context.Context, env *Env, addr, codec string, p Params) (Result, error) {
	stream := env.StreamName("kafka", codec)
	if err := env.Client.CreateStream(ctx, stream, int32(p.Partitions)); err != nil {
		return Result{}, err
	}
	defer func() { _ = dropStream(context.WithoutCancel(ctx), env, stream) }()
	compression := kgo.NoCompression()
	if codec == "lz4" {
		compression = kgo.Lz4Compression()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(stream), kgo.ProducerBatchCompression(compression),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.MaxBufferedRecords(4*p.BatchSize*p.Conns))
	if err != nil {
		return Result{}, err
	}
	defer cl.Close()
	srcs := make([]*rowSource, p.Conns)
	for w := range srcs {
		srcs[w] = newRowSource(env, stream, w, p.PayloadBytes)
	}
	load, err := env.measure(ctx, p.Conns, env.Suite.CaseDuration, func(ctx context.Context, w, iter int) (int, int, error) {
		part := int32((w + iter*p.Conns) % p.Partitions)
		recs := make([]*kgo.Record, p.BatchSize)
		bytes := 0
		for i := range recs {
			r, b := srcs[w].next()
			recs[i] = &kgo.Record{Partition: part, Key: []byte(r.key), Value: r.data}
			bytes += b
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return 0, 0, err
		}
		return len(recs), bytes, nil
	})
	if err != nil {
		return Result{}, err
	}
	info, err := env.Client.DescribeStream(ctx, stream)
	if err != nil {
		return Result{}, err
	}
	var stored int64
	for _, pi := range info.PartitionInfo {
		stored += pi.NextOffset
	}
	if stored != load.records {
		return Result{}, fmt.Errorf("%d records acknowledged but the log end offsets of %s sum to %d", load.records, stream, stored)
	}
	r := loadToResult("kafka", "kgo-"+codec, false, p, load)
	r.Note = fmt.Sprintf("franz-go ProduceSync of %d records, %d goroutines on one client, %s batches, idempotent (its default)", p.BatchSize, p.Conns, codec)
	env.Logger.Info("case", "case", r.Case, "records_per_sec", int(r.RecordsPerSec))
	return r, nil
}

// consume measures a franz-go group, a native group and the raw range read, each
// reading the same pre-filled stream from the start.
func (s kafkaScenario) consume(ctx context.Context, env *Env, addr string) ([]Result, error) {
	// As long as the consume scenario's one-group case (consumeSizes: its steady part
	// lasts the suite's CaseDuration; tiny: two native batches per partition, for a
	// latency sample). At 100,000 records (quick, until session 15) the native group's
	// steady part lasted about 0.1 s.
	n, _ := consumeSizes(env.Suite)
	stream := env.StreamName("kafka", "consume")
	if err := env.Client.CreateStream(ctx, stream, consumePartitions); err != nil {
		return nil, err
	}
	defer func() { _ = dropStream(context.WithoutCancel(ctx), env, stream) }()
	if err := fillStream(ctx, env.Pool, stream, consumePartitions, n/consumePartitions, consumePayload); err != nil {
		return nil, err
	}
	rawPool, err := benchPool(ctx, env, consumePartitions)
	if err != nil {
		return nil, err
	}
	defer rawPool.Close()
	if _, err := rawRead(ctx, env, rawPool, stream, 1); err != nil { // warm-up
		return nil, err
	}
	raw, err := rawRead(ctx, env, rawPool, stream, 1)
	if err != nil {
		return nil, err
	}
	native, err := groupsRead(ctx, env, stream, "kafka", 1, int64(n))
	if err != nil {
		return nil, err
	}
	kg, err := s.groupRead(ctx, env, addr, stream, int64(n), false)
	if err != nil {
		return nil, fmt.Errorf("kafka consume: %w", err)
	}
	ka, err := s.groupRead(ctx, env, addr, stream, int64(n), true)
	if err != nil {
		return nil, fmt.Errorf("kafka consume, auto-commit: %w", err)
	}
	raw.steady.latency, native.steady.latency, kg.steady.latency = summarize(raw.samples), summarize(native.samples), summarize(kg.samples)
	ka.steady.latency = summarize(ka.samples)
	wholeRate := func(r readRun) float64 { return float64(r.whole.records) / r.whole.elapsed.Seconds() }
	base := Params{PayloadBytes: consumePayload, BatchSize: consumeBatch, Conns: consumePartitions, Partitions: consumePartitions}
	rr := loadToResult("kafka", "raw-select", true, base, raw.steady)
	rr.Note = fmt.Sprintf("%d records, one reader goroutine per partition; rate from the moment every reader's first query returned (with them %.0f records/s); latency: one range query of %d rows", n, wholeRate(raw), consumeBatch)
	base.Mode = "auto-commit"
	nr := loadToResult("kafka", "consume-group", false, base, native.steady)
	nr.Note = fmt.Sprintf("%d records, one consumergroup.Consumer, committing asynchronously; rate from the moment every partition had its first batch (Run to it: %s; with it %.0f records/s); latency: between two batches of a partition", n, fmtDurations(native.starts), wholeRate(native))
	nr.RatioTo, nr.Ratio = rr.Case, ratio(nr.RecordsPerSec, rr.RecordsPerSec)
	kp := Params{PayloadBytes: consumePayload, Conns: 1, Partitions: consumePartitions, Mode: "commit-each-poll"}
	kr := loadToResult("kafka", "kgo-group", false, kp, kg.steady)
	kr.Note = fmt.Sprintf("%d records, one franz-go group consumer (classic, range), CommitUncommittedOffsets after every poll; rate from the moment every partition returned records (the client's creation to it: %s; with it %.0f records/s); latency: one poll and its commit", n, fmtDurations(kg.starts), wholeRate(kg))
	kr.RatioTo, kr.Ratio = nr.Case, ratio(kr.RecordsPerSec, nr.RecordsPerSec)
	kp.Mode = "auto-commit"
	ar := loadToResult("kafka", "kgo-group", false, kp, ka.steady)
	ar.Note = fmt.Sprintf("%d records, one franz-go group consumer (classic, range), autocommitting every 100 ms as the native group commits (asynchronously, at most every 100 ms); rate from the moment every partition returned records (the client's creation to it: %s; with it %.0f records/s); latency: one poll", n, fmtDurations(ka.starts), wholeRate(ka))
	// The target's case since session 16: the native group's commit policy (the
	// commit after every poll is kr, kept beside it).
	ar.RatioTo, ar.Ratio, ar.Target = nr.Case, ratio(ar.RecordsPerSec, nr.RecordsPerSec), kafkaTarget
	rr.Note += wholeReadNote(raw.wholeRead)
	nr.Note += wholeReadNote(native.wholeRead)
	kr.Note += wholeReadNote(kg.wholeRead)
	ar.Note += wholeReadNote(ka.wholeRead)
	for _, r := range []Result{rr, nr, kr, ar} {
		env.Logger.Info("case", "case", r.Case, "records_per_sec", int(r.RecordsPerSec))
	}
	return []Result{rr, nr, kr, ar}, nil
}

// fmtDurations lists durations in milliseconds.
func fmtDurations(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmt.Sprintf("%.0f ms", float64(d)/1e6)
	}
	return strings.Join(parts, ", ")
}

// groupRead reads stream from the start with a franz-go group consumer of a fresh
// group until it has n records, committing after every poll (CommitUncommittedOffsets),
// or with autoCommit as the native group commits: franz-go's autocommit every 100 ms
// (the native Consumer's CommitInterval), asynchronously. As for the native group
// (steadyWindow), the rate and the CPU count from the moment every partition had
// returned records; the time from the client's creation to it is the start-up. Latency
// samples are one poll (and its commit) each. With env.ConsumeCPUProfile, the read
// that commits after every poll is CPU-profiled, its goroutines and the client's
// labelled side=franz-go.
func (kafkaScenario) groupRead(ctx context.Context, env *Env, addr, stream string, n int64, autoCommit bool) (rr readRun, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if env.ConsumeCPUProfile != "" && !autoCommit {
		f, err := os.Create(env.ConsumeCPUProfile)
		if err != nil {
			return rr, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return rr, err
		}
		defer func() {
			pprof.StopCPUProfile()
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}()
	}
	// The client's goroutines inherit the label.
	pprof.Do(ctx, pprof.Labels("side", "franz-go"), func(ctx context.Context) { rr, err = groupPolls(ctx, env, addr, stream, n, autoCommit) })
	return rr, err
}

func groupPolls(ctx context.Context, env *Env, addr, stream string, n int64, autoCommit bool) (readRun, error) {
	var rr readRun
	sw := newSteadyWindow(env, consumePartitions) // a reader per partition
	sw.start = time.Now()
	commit := kgo.DisableAutoCommit()
	if autoCommit {
		commit = kgo.AutoCommitInterval(100 * time.Millisecond)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup("bench-kafka-"+env.RunID+"-"+randomID()),
		kgo.ConsumeTopics(stream), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), commit,
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return rr, err
	}
	defer cl.Close()
	var records int64
	for records < n {
		t0 := time.Now()
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return rr, fmt.Errorf("%d of %d records: %w", records, n, err)
		}
		if errs := fs.Errors(); len(errs) > 0 {
			return rr, fmt.Errorf("fetch %s/%d: %w", errs[0].Topic, errs[0].Partition, errs[0].Err)
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			bytes := 0
			for _, r := range p.Records {
				bytes += len(r.Key) + len(r.Value)
			}
			if len(p.Records) > 0 {
				sw.delivered(ctx, int(p.Partition), len(p.Records), bytes)
				records += int64(len(p.Records))
			}
		})
		if !autoCommit {
			if err := cl.CommitUncommittedOffsets(ctx); err != nil {
				return rr, fmt.Errorf("commit: %w", err)
			}
		}
		rr.samples = append(rr.samples, time.Since(t0))
	}
	rr.whole = loadResult{elapsed: time.Since(sw.start), records: records}
	steady, err := sw.result(ctx)
	if err != nil {
		return rr, err
	}
	rr.steady, rr.starts, rr.wholeRead = steady, []time.Duration{slices.Max(sw.firsts)}, sw.wholeRead
	return rr, nil
}

// endToEnd measures commit → consumer through the tailer at latencyRate, when the
// suite asks for it and the server can run the tailer, with the latency scenario's
// group modes:
//
//   - paired (the target's): the native group consumer and a franz-go group consumer
//     (over a kafka.Server of its own) read the same producers' events at the same
//     time, each stamping its own delivery of each event against that event's
//     commit, so that both see the same commits, checkpoints and load; with the
//     per-event difference (franz-go's stamp minus the native one's);
//   - sequential: group-tailer (native) and then kafka-group (franz-go), one after
//     the other as before session 13, each with its own load: their p99s differed by
//     ±10 ms between runs on a loaded 2-core machine, more than the target's 1 ms.
//     The sequential group-tailer case is also the latency target's (commit → group
//     handler): the latency scenario's own mode, which the quick suite leaves out.
func (kafkaScenario) endToEnd(ctx context.Context, env *Env) ([]Result, error) {
	d := env.Suite.KafkaLatencyDuration
	if d <= 0 {
		return nil, nil
	}
	var walLevel string
	if err := env.Pool.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return nil, err
	}
	if walLevel != "logical" {
		env.AddNote("kafka", "Kafka end to end: not measured", fmt.Sprintf("The server runs with wal_level=%s; the tailer needs logical.\n", walLevel))
		return nil, nil
	}
	var out []Result
	for _, mode := range []string{"kafka-paired", "group-tailer", "kafka-group"} {
		rs, err := latencyScenario{}.run(ctx, env, mode, d)
		if err != nil {
			return nil, fmt.Errorf("kafka end to end %s: %w", mode, err)
		}
		for _, r := range rs {
			r.Scenario = "kafka"
			r.Case = e2eCase(r.System)
			r.Baseline = r.System == "kafka-paired-native" || r.System == "group-tailer"
			if r.RatioTo != "" {
				r.RatioTo = e2eCase("kafka-paired-native")
			}
			if r.Paired != "" {
				r.Paired = "kafka e2e paired"
			}
			out = append(out, r)
		}
	}
	seq, base := find(out, e2eCase("kafka-group")), find(out, e2eCase("group-tailer"))
	for i := range out {
		if out[i].Case == seq.Case {
			out[i].RatioTo, out[i].Ratio = base.Case, resultRatio(seq, base)
		}
	}
	return out, nil
}

// e2eCase names the end-to-end case of a latency mode's result system.
func e2eCase(system string) string {
	name := map[string]string{
		"kafka-paired-native": "paired native",
		"kafka-paired-kafka":  "paired kafka",
		"kafka-paired-diff":   "paired kafka-minus-native",
		"group-tailer":        "sequential group-tailer",
		"kafka-group":         "sequential kafka-group",
	}[system]
	return fmt.Sprintf("kafka e2e %s %d/s", name, latencyRate)
}

// startKafkaGroup is startGroup's twin for the Kafka modes: a kafka.Server
// long-polling on hub and one franz-go group consumer of the stream, which stamps
// each record into st when a poll returns it (its goroutine is waited for with wg and
// ends with ctx).
func (latencyScenario) startKafkaGroup(ctx context.Context, env *Env, hub *wakeup.Hub, stream string, st *groupStamps, wg *sync.WaitGroup) error {
	// The server gets a pool of its own, as the native consumer does (startGroup) and
	// as `streamd serve` has: on the producers' pool its reads waited for the
	// producers' new connections at the start of the timed part (hundreds of ms
	// under load, at the tail of the distribution).
	pool, err := benchPool(ctx, env, 8)
	if err != nil {
		return err
	}
	addr, stopKafka, err := startKafkaServer(ctx, env, pool, hub)
	if err != nil {
		pool.Close()
		return err
	}
	stopServer := func() { stopKafka(); pool.Close() }
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup("bench-latency-kafka-"+stream),
		kgo.ConsumeTopics(stream), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(5*time.Second))
	if err != nil {
		stopServer()
		return err
	}
	wg.Add(1)
	go func() { // owner: this run; exits when ctx ends (the run's stop)
		defer wg.Done()
		defer stopServer()
		defer cl.Close()
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			now := time.Now().UnixNano()
			fs.EachRecord(func(r *kgo.Record) { st.stamp(r.Partition, r.Offset, now) })
			st.check()
		}
	}()
	return nil
}
