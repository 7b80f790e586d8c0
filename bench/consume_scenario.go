package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/backoff"
	"github.com/streamd/streamd/internal/sqlerr"
)

// consumeScenario measures consumer groups (issue 3) reading a pre-filled stream of 4
// partitions from the start to the end, in CommitAuto mode (asynchronous commits),
// against the raw primary-key range read of the same rows in the same run:
//
//   - consume-group: one consumergroup.Consumer (its own pool, default config)
//     reading every partition;
//   - raw-select: 4 goroutines, one per partition, each reading its partition with
//     rawFetchSQL in batches of 500 (the consumer's MaxBatchSize) on a pool of its own;
//   - consume-5-groups: five groups (five consumers, five pools) reading the whole
//     stream at once, against raw-select-5x: five sets of the 4 raw readers at once.
//
// Rates and CPU are the steady state (steadyWindow), for both sides alike: from the
// moment every partition of every group was handed its first batch (every raw reader
// had its first query back) to the last record. A group's start-up (its connections,
// the join, the first heartbeat, the start positions and the first fetch) is its own
// timing case, "<case> join", one sample per group and repetition; the notes give the
// rate with the start-up as well (kafka-consumer-perf-test likewise reports the fetch
// rate apart from the rebalance time).
//
// Each case reads long enough to mean something (issue 21 §3): the one-group case and
// its raw readers read a stream of consumeSizes' one records, the five-group cases
// another of five records, each sized so that its steady part lasts at least the
// suite's CaseDuration at rates above the quiet machine's. At 200k records for both
// (before session 15) a side's read lasted 0.5–1.2 s, and one 100 ms stall of a
// loaded 2-core machine was a fifth of it.
//
// Each stream is filled and vacuumed (fillStream: so that no autovacuum of the fill
// runs during one side's read and not the other's; the vacuum also sets the hint
// bits), a checkpoint writes the fills' pages out (so that no read shares the cores
// with their writing), and the raw readers read each stream once unmeasured (without
// it the first measured read after the fills ran at about half the rate of the next
// ones in 3 of 5 runs in session 15, once with the checkpoint); then the sides
// alternate (raw, group, group, raw), each measured twice (once in the tiny suite), so
// that each run's ratio has both orders in it, and each result adds its repetitions
// up.
type consumeScenario struct{}

func init() { register(50, consumeScenario{}) }

func (consumeScenario) Name() string { return "consume" }

const (
	consumePartitions = 4
	consumeBatch      = 500
	consumePayload    = 100
)

// bySuite picks a size by suite name: the tiny suite proves the harness, quick is
// `make bench`, full anything else.
func bySuite(env *Env, tiny, quick, full int) int {
	switch env.Suite.Name {
	case "tiny":
		return tiny
	case "quick":
		return quick
	}
	return full
}

// consumeFastest are steady rates (records/s, all groups together) above those of
// the last quiet quick suite on the 2-core machine (session 15, the fill vacuumed: one
// group 564k, its raw readers 458k; five groups 580k, their raw readers 487k), one
// group and five (the kafka scenario's consume case reads the one-group size too):
// consumeSizes sizes the streams so that a case's steady part lasts at least the
// suite's CaseDuration at these rates. Faster reads happen (640k for one group, for
// a few seconds at 10:35 in session 15): their steady part is shorter.
const (
	consumeFastest1 = 600_000
	consumeFastest5 = 600_000
)

// consumeSizes returns the records of the one-group case's stream and of the
// five-group cases' stream (each group reads all of it). A stream must last the
// suite's CaseDuration at consumeFastest (rounded up to whole 500-record batches per
// partition); the tiny suite, which only proves the harness, reads 4,000.
func consumeSizes(s Suite) (one, five int) {
	if s.Name == "tiny" {
		return 4_000, 4_000
	}
	size := func(rate, groups int) int {
		per := consumePartitions * consumeBatch
		n := int(float64(rate)*s.CaseDuration.Seconds()) / groups
		return (n + per - 1) / per * per
	}
	return size(consumeFastest1, 1), size(consumeFastest5, 5)
}

func (s consumeScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	n1, n5 := consumeSizes(env.Suite)
	reps := bySuite(env, 1, 2, 2)
	// One pool per reader process: the raw readers' pool has a connection per reader.
	rawPool, err := benchPool(ctx, env, 5*consumePartitions)
	if err != nil {
		return nil, err
	}
	defer rawPool.Close()
	// fill creates and fills one of the two streams.
	fill := func(name string, n int) (string, error) {
		stream := env.StreamName("consume", name)
		if err := env.Client.CreateStream(ctx, stream, consumePartitions); err != nil {
			return "", err
		}
		t0 := time.Now()
		if err := fillStream(ctx, env.Pool, stream, consumePartitions, n/consumePartitions, consumePayload); err != nil {
			return stream, err
		}
		env.Logger.Info("consume: loaded", "stream", stream, "records", n, "seconds", time.Since(t0).Seconds())
		return stream, nil
	}
	stream1, err := fill("1", n1)
	if stream1 != "" {
		defer func() { _ = dropStream(ctx, env, stream1) }()
	}
	if err != nil {
		return nil, err
	}
	stream5, err := fill("5", n5)
	if stream5 != "" {
		defer func() { _ = dropStream(ctx, env, stream5) }()
	}
	if err != nil {
		return nil, err
	}
	if err := checkpoint(ctx, env); err != nil {
		return nil, err
	}
	for _, stream := range []string{stream1, stream5} {
		if _, err := rawRead(ctx, env, rawPool, stream, 1); err != nil { // warm-up
			return nil, fmt.Errorf("consume warm-up: %w", err)
		}
	}

	type side struct {
		system   string
		baseline bool
		groups   int
		n        int // records in the side's stream
		run      func(ctx context.Context, rep int) (readRun, error)
	}
	sides := []side{
		{"raw-select", true, 1, n1, func(ctx context.Context, _ int) (readRun, error) {
			return rawRead(ctx, env, rawPool, stream1, 1)
		}},
		{"consume-group", false, 1, n1, func(ctx context.Context, rep int) (readRun, error) {
			return groupsRead(ctx, env, stream1, fmt.Sprintf("g1-%d", rep), 1, int64(n1))
		}},
		{"raw-select-5x", true, 5, n5, func(ctx context.Context, _ int) (readRun, error) {
			return rawRead(ctx, env, rawPool, stream5, 5)
		}},
		{"consume-5-groups", false, 5, n5, func(ctx context.Context, rep int) (readRun, error) {
			return groupsRead(ctx, env, stream5, fmt.Sprintf("g5-%d", rep), 5, int64(n5))
		}},
	}
	totals := make([]loadResult, len(sides))
	wholes := make([]loadResult, len(sides))
	samples := make([][]time.Duration, len(sides))
	starts := make([][]time.Duration, len(sides))
	wholeRead := make([]bool, len(sides))
	for rep := 0; rep < reps; rep++ {
		for pair := 0; pair < len(sides); pair += 2 {
			order := []int{pair, pair + 1}
			if rep%2 == 1 {
				order = []int{pair + 1, pair}
			}
			for _, i := range order {
				rr, err := sides[i].run(ctx, rep)
				if err != nil {
					return nil, fmt.Errorf("consume %s: %w", sides[i].system, err)
				}
				l := rr.steady
				env.Logger.Info("consume rep", "system", sides[i].system, "rep", rep, "records_per_sec", int(float64(l.records)/l.elapsed.Seconds()),
					"whole_records_per_sec", int(float64(rr.whole.records)/rr.whole.elapsed.Seconds()))
				t := &totals[i]
				t.records += l.records
				t.bytes += l.bytes
				t.elapsed += l.elapsed
				t.clientCPU += l.clientCPU
				t.serverCPU += l.serverCPU
				wholes[i].records += rr.whole.records
				wholes[i].elapsed += rr.whole.elapsed
				samples[i] = append(samples[i], rr.samples...)
				starts[i] = append(starts[i], rr.starts...)
				wholeRead[i] = wholeRead[i] || rr.wholeRead
			}
		}
	}
	var out, joins []Result
	for i, sd := range sides {
		totals[i].latency = summarize(samples[i])
		p := Params{PayloadBytes: consumePayload, BatchSize: consumeBatch, Conns: consumePartitions * sd.groups, Partitions: consumePartitions, Mode: "auto-commit"}
		if sd.baseline {
			p.Mode = ""
		}
		r := loadToResult("consume", sd.system, sd.baseline, p, totals[i])
		whole := float64(wholes[i].records) / wholes[i].elapsed.Seconds()
		r.Note = fmt.Sprintf("%d records read by each of %d group(s), %d repetition(s); rate and CPU from the moment every partition of every group was handed its first batch (the start-up, Run to the first batch, is `%s join`), %.1f s of steady read per repetition; with the start-up %.0f records/s; latency: the time between two batches of a partition (group: fetch, handler, commit)", sd.n, sd.groups, reps, r.Case, totals[i].elapsed.Seconds()/float64(reps), whole)
		if sd.baseline {
			r.Note = fmt.Sprintf("%d records read by each of %d set(s) of %d reader goroutines (one per partition), %d repetition(s); rate and CPU from the moment every reader's first query returned (as for the groups' partitions), %.1f s of steady read per repetition; with the first queries %.0f records/s; latency: one range query of %d rows", sd.n, sd.groups, consumePartitions, reps, totals[i].elapsed.Seconds()/float64(reps), whole, consumeBatch)
		} else {
			jr := timingResult("consume", sd.system+"-join", r.Case+" join", false, p, "one Consumer's Run to its first batch: its pool's connections, join, first heartbeat, start positions, first fetch", starts[i])
			jr.Note = "The start-up that the consume rate above leaves out, as kafka-consumer-perf-test reports its fetch rate apart from the rebalance time."
			joins = append(joins, jr)
		}
		r.Note += wholeReadNote(wholeRead[i])
		env.Logger.Info("case", "case", r.Case, "records_per_sec", int(r.RecordsPerSec))
		out = append(out, r)
	}
	out[1].RatioTo, out[1].Ratio = out[0].Case, ratio(out[1].RecordsPerSec, out[0].RecordsPerSec)
	out[3].RatioTo, out[3].Ratio = out[2].Case, ratio(out[3].RecordsPerSec, out[2].RecordsPerSec)
	return append(out, joins...), nil
}

// checkpoint writes out the dirty pages of what the scenario just loaded, so that
// its first measured side does not run beside their writing. A role that may not
// checkpoint (SQLSTATE 42501: neither superuser nor pg_checkpoint) skips it, with a
// warning.
func checkpoint(ctx context.Context, env *Env) error {
	_, err := env.Pool.Exec(ctx, "CHECKPOINT")
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		env.Logger.Warn("no checkpoint after the fill: the role may not", "error", err)
		return nil
	}
	return err
}

// benchPool opens a pool on env's database with at most conns connections, for a
// reader or consumer that should not share connections with the rest of the run.
func benchPool(ctx context.Context, env *Env, conns int32) (*pgxpool.Pool, error) {
	cfg := env.Pool.Config().Copy()
	cfg.MaxConns = conns
	cfg.MinConns = 0
	return pgxpool.NewWithConfig(ctx, cfg)
}

// quietLogger discards the consumers' log lines (joins and rebalances by the dozen).
var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// steadyWindow is where a read's measured part starts: once every reader of the read
// (each partition of each group, or each raw reader goroutine) has delivered its first
// batch, so that the start-up (for a group: its own pool's connections, the join, the
// first heartbeat, the start positions and the first fetches; measured apart as the
// join time) is not in the rate. A group's start-up is the time from the read's start
// to the first batch of its last partition to start.
// Records and CPU count from the window's start: begin is called by the reader whose
// first batch completes the set, after adding that batch, and samples the CPU then,
// on its own goroutine (that reader waits for it: the window pays for the sample).
type steadyWindow struct {
	env     *Env
	readers int
	start   time.Time // the read's start (Run called, first query sent)

	mu       sync.Mutex
	firsts   []time.Duration // each reader's start-up, by reader
	started  int
	begun    bool
	at       time.Time // the window's start
	records  int64     // records and bytes delivered before the window started
	bytes    int64
	cpu      cpuSample
	total    atomic.Int64 // records delivered, all readers
	totalB   atomic.Int64 // their bytes
	startedR []bool
	// wholeRead: result found no steady part and gave the whole read instead.
	wholeRead bool
}

func newSteadyWindow(env *Env, readers int) *steadyWindow {
	return &steadyWindow{env: env, readers: readers, startedR: make([]bool, readers), firsts: make([]time.Duration, readers)}
}

// delivered adds a batch of reader i (records, bytes) and starts the window when
// this is the last reader's first batch.
func (sw *steadyWindow) delivered(ctx context.Context, i int, records, bytes int) {
	sw.total.Add(int64(records))
	sw.totalB.Add(int64(bytes))
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.startedR[i] {
		return
	}
	sw.startedR[i] = true
	now := time.Now()
	sw.firsts[i] = now.Sub(sw.start)
	if sw.started++; sw.started < sw.readers {
		return
	}
	sw.begun, sw.at = true, now
	sw.records, sw.bytes = sw.total.Load(), sw.totalB.Load()
	sw.cpu = sampleCPU(ctx, sw.env)
}

// result is the window's totals once every record was delivered.
func (sw *steadyWindow) result(ctx context.Context) (loadResult, error) {
	end := time.Now()
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if !sw.begun {
		return loadResult{}, fmt.Errorf("steady window: %d of %d readers delivered a batch", sw.started, sw.readers)
	}
	res := loadResult{elapsed: end.Sub(sw.at), records: sw.total.Load() - sw.records, bytes: sw.totalB.Load() - sw.bytes}
	res.clientCPU, res.serverCPU = cpuSince(ctx, sw.env, sw.cpu)
	if res.records == 0 {
		// Every record came with the readers' first batches (a read too short for a
		// steady part, as the tiny suite's): the rate is the whole read's, start-up
		// included, and the CPU only what followed the last first batch.
		res.elapsed, res.records, res.bytes = end.Sub(sw.start), sw.total.Load(), sw.totalB.Load()
		sw.wholeRead = true
	}
	return res, nil
}

// readRun is one measured read: its steady part, the latency samples, the readers'
// start-up times and the whole read (start-up included), for the note.
type readRun struct {
	steady  loadResult
	samples []time.Duration
	starts  []time.Duration
	whole   loadResult // records and elapsed only
	// wholeRead: the read had no steady part, and steady is the whole read.
	wholeRead bool
}

// wholeReadNote is what a case's note adds when a read of it had no steady part.
func wholeReadNote(whole bool) string {
	if !whole {
		return ""
	}
	return "; a read of this case had no steady part (every record came with the first batches), so its rate is the whole read's, start-up included, and its CPU only what followed the last first batch"
}

// groupsRead runs one consumer in each of groups fresh groups (named prefix-i) on
// stream until each has handled n records. The rate and the CPU are those of the
// steady part (steadyWindow: from the moment every partition of every group was handed
// its first batch); each group's time from Run to its last partition's first batch is
// its start-up. Latency
// samples are the times between two batches of the same partition.
func groupsRead(ctx context.Context, env *Env, stream, prefix string, groups int, n int64) (readRun, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type member struct {
		pool    *pgxpool.Pool
		c       *consumergroup.Consumer
		handled atomic.Int64
		done    chan struct{} // closed when handled reaches n
		once    sync.Once
		mu      sync.Mutex
		last    map[int32]time.Time
		samples []time.Duration
	}
	ms := make([]*member, groups)
	sw := newSteadyWindow(env, groups*consumePartitions) // reader g*4+p: partition p of group g
	var rr readRun
	// The pools are made before the clock starts, but connect on first use: each
	// consumer's connections are part of its start-up, as in a process that starts.
	for i := range ms {
		pool, err := benchPool(ctx, env, consumePartitions+2)
		if err != nil {
			return rr, err
		}
		defer pool.Close()
		c, err := consumergroup.New(pool, &consumergroup.Config{
			Stream: stream, Group: fmt.Sprintf("bench-%s-%d-%s", prefix, i, env.RunID),
			ConsumerID: fmt.Sprintf("bench-%d", i), Logger: quietLogger,
		})
		if err != nil {
			return rr, err
		}
		ms[i] = &member{pool: pool, c: c, done: make(chan struct{}), last: map[int32]time.Time{}}
	}
	sw.start = time.Now()
	var wg sync.WaitGroup
	errs := make([]error, groups)
	for i, m := range ms {
		wg.Add(1)
		go func() { // owner: groupsRead; exits when ctx is cancelled (below)
			defer wg.Done()
			errs[i] = m.c.Run(ctx, func(hctx context.Context, b *consumergroup.Batch) error {
				now := time.Now()
				bytes := 0
				for j := range b.Events {
					bytes += b.Events[j].Size()
				}
				m.mu.Lock()
				if t, ok := m.last[b.Partition]; ok {
					m.samples = append(m.samples, now.Sub(t))
				}
				m.last[b.Partition] = now
				m.mu.Unlock()
				sw.delivered(ctx, i*consumePartitions+int(b.Partition), len(b.Events), bytes)
				if m.handled.Add(int64(len(b.Events))) >= n {
					m.once.Do(func() { close(m.done) })
				}
				return nil
			})
		}()
	}
	for i, m := range ms {
		select {
		case <-m.done:
		case <-ctx.Done():
			cancel()
			wg.Wait()
			return rr, ctx.Err()
		case <-time.After(5 * time.Minute):
			cancel()
			wg.Wait()
			return rr, fmt.Errorf("group %d handled %d of %d records in 5 minutes", i, m.handled.Load(), n)
		}
	}
	rr.whole = loadResult{elapsed: time.Since(sw.start), records: sw.total.Load()}
	steady, err := sw.result(ctx)
	cancel()
	wg.Wait()
	if err != nil {
		return rr, err
	}
	rr.wholeRead = sw.wholeRead
	for i, m := range ms {
		if errs[i] != nil {
			return rr, fmt.Errorf("consumer %d: %w", i, errs[i])
		}
		rr.samples = append(rr.samples, m.samples...)
	}
	rr.steady = steady
	for g := range groups { // a group's start-up ends with its last partition's first batch
		rr.starts = append(rr.starts, slices.Max(sw.firsts[g*consumePartitions:(g+1)*consumePartitions]))
	}
	return rr, nil
}

// rawRead reads every partition of stream from offset 0 to its end with rawFetchSQL
// on streamd.events, one goroutine per partition, copies times at once, and returns
// the steady part (steadyWindow: from the moment every reader's first query returned)
// with one latency sample per query and the CPU spent.
func rawRead(ctx context.Context, env *Env, pool *pgxpool.Pool, stream string, copies int) (readRun, error) {
	sql := fmt.Sprintf(rawFetchSQL, "streamd.events")
	workers := copies * consumePartitions
	type out struct {
		samples []time.Duration
		err     error
	}
	outs := make([]out, workers)
	sw := newSteadyWindow(env, workers)
	var wg sync.WaitGroup
	sw.start = time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() { // owner: rawRead; exits at the partition's end or on error
			defer wg.Done()
			o := &outs[w]
			part := int32(w % consumePartitions)
			for off := int64(0); ; {
				t0 := time.Now()
				k, b, last, err := rawBatch(ctx, pool, sql, stream, part, off)
				if err != nil {
					o.err = err
					return
				}
				o.samples = append(o.samples, time.Since(t0))
				if k == 0 {
					return
				}
				sw.delivered(ctx, w, k, b)
				off = last + 1
			}
		}()
	}
	wg.Wait()
	var rr readRun
	rr.whole = loadResult{elapsed: time.Since(sw.start), records: sw.total.Load()}
	for _, o := range outs {
		if o.err != nil {
			return rr, o.err
		}
		rr.samples = append(rr.samples, o.samples...)
	}
	steady, err := sw.result(ctx)
	if err != nil {
		return rr, err
	}
	rr.steady, rr.starts, rr.wholeRead = steady, sw.firsts, sw.wholeRead
	return rr, nil
}

// rawBatch runs one raw range query and scans every column into Go values, as
// Fetch does. It returns the rows, their payload bytes and the last offset.
func rawBatch(ctx context.Context, pool *pgxpool.Pool, sql, stream string, part int32, off int64) (k, b int, last int64, err error) {
	rows, err := pool.Query(ctx, sql, stream, part, off, consumeBatch)
	if err != nil {
		return 0, 0, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id, typ         string
			key, corr, caus *string
			data, bin, meta []byte
			ts              time.Time
			version         int32
		)
		if err := rows.Scan(&last, &id, &typ, &key, &data, &bin, &meta, &ts, &corr, &caus, &version); err != nil {
			return 0, 0, 0, err
		}
		k++
		b += len(data) + len(bin)
		if key != nil {
			b += len(*key)
		}
	}
	return k, b, last, rows.Err()
}

// fillSQL writes $4 events of about $5 bytes of JSON into partition $2 of stream $1
// from offset $3, generated in the server: the trusted insert path (reserveSQL first
// in the same transaction) that skips streamd.append, so that large logs fill fast.
// Event ids are unique per partition and offset; keys cycle over 1000 values.
const fillSQL = `INSERT INTO streamd.events
	(stream_name, partition, "offset", event_id, event_type, key, data, "timestamp", version)
SELECT $1::text, $2::integer, $3::bigint + g, $2::integer::text || '-' || ($3::bigint + g)::text, 'bench',
       'user-' || (g % 1000)::text,
       jsonb_build_object('id', g, 'pad', substr(repeat(md5(g::text), 1 + $5::integer / 32), 1, greatest($5::integer - 24, 1))),
       $6::timestamptz, 1
  FROM generate_series(0::bigint, $4::bigint - 1) AS g`

// fillStream appends perPartition events of about size bytes to each of stream's
// partitions, in transactions of at most 100,000 rows, then vacuums and analyzes
// streamd.events: the fill's insert-triggered autovacuum (the private clusters' naptime
// is 10 s) otherwise ran during the reads that follow, in one side's measured part
// and not the other's (five times in one consume scenario run of 70 s, session 15).
func fillStream(ctx context.Context, pool *pgxpool.Pool, stream string, partitions, perPartition, size int) error {
	const chunk = 100_000
	// The partitions fill at once, one connection each (at most 4).
	var g errgroup.Group
	g.SetLimit(4)
	for part := int32(0); part < int32(partitions); part++ {
		g.Go(func() error {
			for done := 0; done < perPartition; done += chunk {
				k := min(chunk, perPartition-done)
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					base, ts, err := reserveOffsets(ctx, tx, stream, part, k)
					if err != nil {
						return err
					}
					_, err = tx.Exec(ctx, fillSQL, stream, part, base, int64(k), size, ts)
					return err
				})
				if err != nil {
					return fmt.Errorf("fill %s/%d: %w", stream, part, err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	// VACUUM (ANALYZE) can be a deadlock victim against a concurrent CREATE INDEX on
	// events (another test of the same database turning a read index on): try again.
	bo := backoff.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for attempt := 1; ; attempt++ {
		_, err := pool.Exec(ctx, "VACUUM (ANALYZE) streamd.events")
		if err == nil {
			return nil
		}
		if attempt == 5 || !sqlerr.Retriable(err) {
			return fmt.Errorf("vacuum events: %w", err)
		}
		bo.Wait(ctx)
	}
}
