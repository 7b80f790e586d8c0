package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/tailer"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// latencyScenario measures end-to-end delivery latency at a steady ~1,000 events/s
// (one event per transaction), three ways in the same run:
//
//   - tailer: the WAL tailer and Broadcaster (coalesced pg_notify from its own
//     transactions) and a Listener; the reader fetches on each wake-up;
//   - tailer-inprocess: the reader's process runs the tailer and is woken directly
//     (no pg_notify hop), as a worker may;
//   - listen: LISTEN/NOTIFY without the tailer: the producer calls pg_notify in its
//     own transaction (what the tailer spares producers), the same Listener wakes
//     the reader;
//   - poll: no wake-ups; the reader long-polls with streams.FetchOpts.MaxWait (5ms
//     doubling to 100ms), the safety net's behaviour;
//   - group-tailer: the tailer's wake-ups as in "tailer", read by one
//     consumergroup.Consumer (the whole processing loop: fetch, handler, commit);
//     the latency is commit → the handler being called with the event, after one
//     untimed warm-up event per partition (the join is a rebalance, not delivery).
//
// The kafka scenario runs two more modes through run (kafkaScenario.endToEnd):
// kafka-group, a franz-go group consumer over a kafka.Server in group-tailer's place,
// and kafka-paired, both group consumers at once on the same events (pairedResults).
//
// Latency is from the producer's commit returning to the reader's fetch returning the
// event, both clocks in this process. A reader may see an event before the producer
// sees its commit acknowledged; such samples count as 0 and are reported in the note.
// Each mode gives timing-only results (commit→fetch, and commit→wake-up for the modes
// with wake-ups), with ratios to listen's: LISTEN/NOTIFY is the raw-PostgreSQL
// baseline. The keep-up cases are throughput results.
//
// It runs in the full suite on the benchmark's own server (its wal_level must be
// logical), for Suite.LatencyDuration per mode; there the tailers' temporary slots
// may take 15 to 30 s each to be created while other work writes (see tailertest),
// which is setup, not measured. TestLatencyScenario (`make bench-latency`) runs it on
// a private cluster instead, with fsync off.
type latencyScenario struct{}

// After the scenarios that measure throughput, before growth (whose loads would
// disturb it).
func init() { register(95, latencyScenario{}) }

func (latencyScenario) Name() string { return "latency" }

// runsOnce: each mode runs for the suite's latency duration and waits for a replication slot; Suite.Repeats does not apply.
func (latencyScenario) runsOnce() bool { return true }

// latencyReadyWait bounds the wait for a tailer's slot and a listener's connection.
const latencyReadyWait = 2 * time.Minute

const (
	latencyRate      = 1000 // events per second
	latencyProducers = 4
	// latencyInFlight bounds the appends of one lane started and not yet returned.
	latencyInFlight = 16
)

var latencyPayload = []byte(`{"k":1}`)

func (s latencyScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	d := env.Suite.LatencyDuration
	if d <= 0 {
		env.Logger.Info("latency: not in this suite (make bench-latency, or -suite full)", "suite", env.Suite.Name)
		return nil, nil
	}
	var walLevel string
	if err := env.Pool.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return nil, err
	}
	if walLevel != "logical" {
		env.Logger.Warn("latency: skipped, the server's wal_level is not logical", "wal_level", walLevel)
		env.AddNote("latency", "Latency: not measured", fmt.Sprintf("The server runs with wal_level=%s; the tailer needs logical.\n", walLevel))
		return nil, nil
	}
	var out []Result
	for _, mode := range []string{"tailer", "tailer-inprocess", "listen", "poll", "group-tailer"} {
		rs, err := s.run(ctx, env, mode, d)
		if err != nil {
			return nil, fmt.Errorf("latency %s: %w", mode, err)
		}
		out = append(out, rs...)
	}
	// Ratios to the raw LISTEN/NOTIFY path: commit→fetch to listen's, commit→wake-up
	// to listen's wake-up.
	for i := range out {
		if out[i].System == "listen" || out[i].System == "listen-wakeup" {
			continue
		}
		ref := "latency listen " + fmt.Sprint(latencyRate) + "/s"
		if strings.HasSuffix(out[i].System, "-wakeup") {
			ref += " wake-up"
		}
		if base := find(out, ref); base.Case != "" {
			out[i].RatioTo, out[i].Ratio = ref, resultRatio(out[i], base)
		}
	}
	for _, batch := range []int{100, 1000} {
		r, err := s.keepUp(ctx, env, d, batch)
		if err != nil {
			return nil, fmt.Errorf("latency keep-up b=%d: %w", batch, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// run measures one mode. It returns the commit→fetch result and, for the modes with
// wake-ups, the commit→wake-up result: the time until the reader was woken after the
// commit or already had the event, whichever came first.
func (s latencyScenario) run(ctx context.Context, env *Env, mode string, d time.Duration) ([]Result, error) {
	name := fmt.Sprintf("latency %s %d/s", mode, latencyRate)
	params := Params{Partitions: latencyProducers, BatchSize: 1, Conns: latencyProducers, Mode: mode}
	stream := env.StreamName("latency", mode)
	if err := env.Client.CreateStream(ctx, stream, latencyProducers); err != nil {
		return nil, err
	}
	defer func() { _ = env.Client.DeleteStream(context.WithoutCancel(ctx), stream) }()
	url := env.Pool.Config().ConnString()

	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	start := func(name string, run func(context.Context) error) {
		wg.Add(1)
		go func() { // owner: this run; exits when it returns (stop)
			defer wg.Done()
			if err := run(rctx); err != nil {
				env.Logger.Warn("latency helper failed", "helper", name, "error", err)
			}
		}()
	}

	var hub *wakeup.Hub
	if mode == "tailer-inprocess" {
		hub = wakeup.NewHub()
		b, err := wakeup.NewBroadcaster(&wakeup.BroadcasterConfig{ConnString: url, Hub: hub, Logger: env.Logger, NoNotify: true})
		if err != nil {
			return nil, err
		}
		start("broadcaster", b.Run)
		deadline := time.Now().Add(latencyReadyWait)
		for !b.Streaming() {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("tailer not streaming within %s", latencyReadyWait)
			}
			time.Sleep(10 * time.Millisecond) // polling interval
		}
	} else if mode != "poll" {
		l, err := wakeup.NewListener(&wakeup.ListenerConfig{ConnString: url, Logger: env.Logger})
		if err != nil {
			return nil, err
		}
		start("listener", l.Run)
		hub = l.Hub
		ready := func() bool { return l.Connected() }
		if mode == "tailer" || groupMode(mode) {
			b, err := wakeup.NewBroadcaster(&wakeup.BroadcasterConfig{ConnString: url, Logger: env.Logger})
			if err != nil {
				return nil, err
			}
			start("broadcaster", b.Run)
			ready = func() bool { return l.Connected() && b.Streaming() }
		}
		deadline := time.Now().Add(latencyReadyWait)
		for !ready() {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("wake-up path not ready within %s", latencyReadyWait)
			}
			time.Sleep(10 * time.Millisecond) // polling interval
		}
	}

	// One lane per partition: a producer (one event per append, paced open loop at its
	// share of latencyRate: a commit that waits for its WAL flush can take longer than
	// the pace, and appends to one partition serialise, so up to latencyInFlight of a
	// lane's appends run at once) and a reader.
	n := int(d/time.Second*latencyRate/latencyProducers) + latencyRate
	lanes := make([]*latencyLane, latencyProducers)
	for i := range lanes {
		lanes[i] = &latencyLane{partition: int32(i), acked: make([]atomic.Int64, n), seen: make([]atomic.Int64, n)}
		if mode == "kafka-paired" {
			lanes[i].kseen = make([]atomic.Int64, n)
		}
	}
	readers := len(lanes) // values readersDone gets: one per lane and consumer
	readersDone := make(chan error, 2*len(lanes))
	if groupMode(mode) {
		if err := s.startGroups(rctx, env, hub, stream, mode, lanes, n, &wg, readersDone); err != nil {
			return nil, err
		}
		if mode == "kafka-paired" {
			readers *= 2
		}
	} else {
		for _, ln := range lanes {
			wg.Add(1)
			go func() { // owner: this run (waited for with wg); exits when rctx ends or its lane is all seen
				defer wg.Done()
				readersDone <- s.read(rctx, env, hub, stream, mode, ln)
			}()
		}
	}
	t0 := time.Now()
	end := t0.Add(d)
	var pwg sync.WaitGroup
	perr := make(chan error, 2*len(lanes)) // a lane sends at most twice: its first failed append, then ctx
	for _, ln := range lanes {
		pwg.Add(1)
		go func() { // owner: this run; exits at end, or on ctx or an error, once its appends returned
			defer pwg.Done()
			// The pace is kept open loop: each tick starts its event's append without
			// waiting for the one before to commit (up to latencyInFlight at once), so a
			// slow commit (a WAL flush, a stall) does not lower the rate the consumers
			// see, nor leave the stall's seconds with fewer events in the samples
			// (coordinated omission). The appends of one partition still serialise on its
			// head row; latency is measured from each commit's return.
			var inFlight sync.WaitGroup
			defer ln.finished.Store(true)
			defer inFlight.Wait()
			slots := make(chan struct{}, latencyInFlight)
			var failed atomic.Bool
			tick := time.NewTicker(time.Second * latencyProducers / latencyRate)
			defer tick.Stop()
			for started := 0; time.Now().Before(end) && started < n && !failed.Load(); started++ {
				select {
				case <-ctx.Done():
					perr <- ctx.Err()
					return
				case <-tick.C:
				}
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					perr <- ctx.Err()
					return
				}
				inFlight.Add(1)
				go func() { // owner: this lane's producer, which waits for it
					defer inFlight.Done()
					defer func() { <-slots }()
					off, err := s.produce(ctx, env, stream, ln.partition, mode)
					if err != nil {
						if failed.CompareAndSwap(false, true) {
							perr <- err
						}
						return
					}
					if i := off - ln.base; i >= 0 && i < int64(n) {
						ln.acked[i].Store(time.Now().UnixNano())
					}
					ln.produced.Add(1)
				}()
			}
		}()
	}
	pwg.Wait()
	close(perr)
	if err := <-perr; err != nil {
		return nil, err
	}
	elapsed := time.Since(t0)

	// Wait for the readers to see everything (or give up after 10s).
	giveUp := time.After(10 * time.Second)
	for range readers {
		select {
		case err := <-readersDone:
			if err != nil {
				return nil, err
			}
		case <-giveUp:
			stop()
			<-readersDone
		}
	}

	if mode == "kafka-paired" {
		return pairedResults(lanes, n, elapsed, params, name)
	}
	var samples, wakeSamples []time.Duration
	var total int64
	early, missing := 0, 0
	for _, ln := range lanes {
		produced := ln.produced.Load()
		total += produced
		ln.mu.Lock()
		wakes := ln.wakes
		ln.mu.Unlock()
		for i := int64(0); i < produced && i < int64(n); i++ {
			a, r := ln.acked[i].Load(), ln.seen[i].Load()
			if a == 0 || r == 0 {
				missing++
				continue
			}
			lat := time.Duration(r - a)
			if lat < 0 {
				early++
				lat = 0
			}
			samples = append(samples, lat)
			// The first wake-up at or after the commit returned, if before the fetch.
			j, _ := slices.BinarySearch(wakes, a)
			known := r
			if j < len(wakes) && wakes[j] < known {
				known = wakes[j]
			}
			wakeSamples = append(wakeSamples, time.Duration(max(known-a, 0)))
		}
	}
	if missing > 0 {
		return nil, fmt.Errorf("%d of %d events not delivered within 10s", missing, total)
	}
	rate := rateText(total, elapsed)
	op := "commit returned → fetch returned the event"
	switch mode {
	case "group-tailer":
		op = opNative
	case "kafka-group":
		op = opKafka
	}
	res := timingResult("latency", mode, name, mode == "listen", params, op, samples)
	res.Note = fmt.Sprintf("%s; %d seen before the producer's commit returned (counted as 0)", rate, early)
	res.EventRate = round3(float64(total) / elapsed.Seconds())
	out := []Result{res}
	if hub != nil && !groupMode(mode) {
		wr := timingResult("latency", mode+"-wakeup", name+" wake-up", mode == "listen", params,
			"commit returned → reader woken, or the event fetched if sooner", wakeSamples)
		wr.Note = rate
		out = append(out, wr)
	}
	return out, nil
}

// The group modes' operations.
const (
	opNative = "commit returned → the group's handler called with the event"
	opKafka  = "commit returned → a franz-go group consumer's poll returned the event (over a kafka.Server woken by the tailer)"
)

// groupMode reports whether mode reads with group consumers (startGroups) rather
// than with one reader per lane.
func groupMode(mode string) bool {
	return mode == "group-tailer" || mode == "kafka-group" || mode == "kafka-paired"
}

func rateText(total int64, elapsed time.Duration) string {
	return fmt.Sprintf("%d events at %.0f/s (paced at %d/s)", total, float64(total)/elapsed.Seconds(), latencyRate)
}

// pairedResults are the kafka-paired mode's three timing results, all over the same
// events: commit → the native group's handler (system kafka-paired-native), commit →
// the franz-go group's poll (kafka-paired-kafka), and for each event the second minus
// the first (kafka-paired-diff, negative when franz-go got it first). Deliveries
// before the commit returned count as 0 in the first two, as in the other modes; the
// difference is of the raw stamps.
func pairedResults(lanes []*latencyLane, n int, elapsed time.Duration, params Params, name string) ([]Result, error) {
	var native, kafka, diff []time.Duration
	var total int64
	early, missing := [2]int{}, 0
	for _, ln := range lanes {
		produced := ln.produced.Load()
		total += produced
		for i := int64(0); i < produced && i < int64(n); i++ {
			a, r, k := ln.acked[i].Load(), ln.seen[i].Load(), ln.kseen[i].Load()
			if a == 0 || r == 0 || k == 0 {
				missing++
				continue
			}
			for j, got := range [2]int64{r, k} {
				if got < a {
					early[j]++
				}
			}
			native = append(native, time.Duration(max(r-a, 0)))
			kafka = append(kafka, time.Duration(max(k-a, 0)))
			diff = append(diff, time.Duration(k-r))
		}
	}
	if missing > 0 {
		return nil, fmt.Errorf("%d of %d events not delivered to both consumers within 10s", missing, total)
	}
	rate := rateText(total, elapsed)
	nr := timingResult("latency", "kafka-paired-native", name+" native", true, params, opNative+", read at the same time as the franz-go group", native)
	nr.Note = fmt.Sprintf("%s; %d seen before the producer's commit returned (counted as 0)", rate, early[0])
	kr := timingResult("latency", "kafka-paired-kafka", name+" kafka", false, params, opKafka+", read at the same time as the native group", kafka)
	kr.Note = fmt.Sprintf("%s; %d seen before the producer's commit returned (counted as 0)", rate, early[1])
	dr := timingResult("latency", "kafka-paired-diff", name+" kafka−native", false, params,
		"per event: the franz-go poll's stamp minus the native handler's (negative: franz-go first)", diff)
	dr.Note = rate
	kr.RatioTo, kr.Ratio = nr.Case, resultRatio(kr, nr)
	out := []Result{nr, kr, dr}
	for i := range out {
		out[i].Paired = name
		out[i].EventRate = round3(float64(total) / elapsed.Seconds())
	}
	return out, nil
}

// latencyLane is one partition's producer and reader.
type latencyLane struct {
	partition int32
	base      int64          // the offset of the lane's first timed event (after warm-up events)
	acked     []atomic.Int64 // unix ns when the producer's commit returned, by offset - base
	seen      []atomic.Int64 // unix ns when the reader's fetch returned it, by offset (- base for the group modes)
	kseen     []atomic.Int64 // kafka-paired: seen's twin for the franz-go group, beside the native one in seen
	produced  atomic.Int64
	finished  atomic.Bool // the producer stopped; produced is final
	mu        sync.Mutex
	wakes     []int64 // unix ns of each wake-up the reader got, ascending
}

// produce appends one event in its own transaction and returns its offset. In listen
// mode the transaction also notifies, as an application without the tailer would.
func (latencyScenario) produce(ctx context.Context, env *Env, stream string, partition int32, mode string) (int64, error) {
	rec := streams.Record{Stream: stream, Partition: streams.PartitionOf(partition), Data: latencyPayload}
	if mode != "listen" {
		pos, err := env.Client.Produce(ctx, rec)
		if err != nil {
			return 0, err
		}
		return pos[0].Offset, nil
	}
	tx, err := env.Pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	pos, err := streams.ProduceTx(ctx, tx, rec)
	if err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", wakeup.Channel, fmt.Sprintf("s %d %s", partition, stream)); err != nil {
		return 0, err
	}
	return pos[0].Offset, tx.Commit(ctx)
}

// read follows the lane's partition from offset 0, stamping each event when its fetch
// returns, until the lane's producer stopped and every event it produced was
// fetched, or ctx ends.
func (latencyScenario) read(ctx context.Context, env *Env, hub *wakeup.Hub, stream, mode string, ln *latencyLane) error {
	var w *wakeup.Waiter
	if hub != nil {
		sub := hub.SubscribePartition(stream, ln.partition)
		defer sub.Close()
		var err error
		if w, err = wakeup.NewWaiter(sub, &wakeup.PollOpts{MinInterval: 100 * time.Millisecond, MaxInterval: time.Second}); err != nil {
			return err
		}
	}
	opts := &streams.FetchOpts{MaxRecords: 1000}
	if mode == "poll" {
		opts.MaxWait = time.Second
	}
	var off int64
	for ctx.Err() == nil {
		r, err := streams.FetchTx(ctx, env.Pool, stream, ln.partition, off, opts)
		now := time.Now().UnixNano()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, e := range r.Events {
			if e.Offset < int64(len(ln.seen)) {
				ln.seen[e.Offset].Store(now)
			}
		}
		off = r.NextOffset
		if len(r.Events) > 0 {
			continue
		}
		if ln.finished.Load() && off >= ln.produced.Load() {
			return nil
		}
		if w != nil && w.Wait(ctx) {
			now := time.Now().UnixNano()
			ln.mu.Lock()
			ln.wakes = append(ln.wakes, now)
			ln.mu.Unlock()
		}
	}
	return nil
}

// keepUp measures the append rate the tailer keeps up with: producers append
// batches of batchSize records as fast as they can for d while an
// in-process tailer counts the transactions it hands on; the rate is the records
// appended divided by the time from the first append until the tailer handed on the
// last transaction. Lag at the end says how far behind the tailer fell.
func (s latencyScenario) keepUp(ctx context.Context, env *Env, d time.Duration, batchSize int) (Result, error) {
	res := Result{Scenario: "latency", System: "tailer-keepup", Case: fmt.Sprintf("tailer keep-up b=%d c=%d", batchSize, latencyProducers),
		Params: Params{Partitions: latencyProducers, BatchSize: batchSize, Conns: latencyProducers, Mode: "keepup"}}
	stream := env.StreamName("keepup", fmt.Sprint(batchSize))
	if err := env.Client.CreateStream(ctx, stream, latencyProducers); err != nil {
		return res, err
	}
	defer func() { _ = env.Client.DeleteStream(context.WithoutCancel(ctx), stream) }()

	var handled atomic.Int64     // transactions of this stream handed on
	var lastHandled atomic.Int64 // unix ns of the last one
	tl, err := tailer.New(&tailer.Config{
		ConnString: env.Pool.Config().ConnString(),
		Logger:     env.Logger,
		Handler: func(_ context.Context, ev tailer.Event) {
			for _, t := range ev.Targets {
				if t.Name == stream {
					handled.Add(1)
					lastHandled.Store(time.Now().UnixNano())
					return
				}
			}
		},
	})
	if err != nil {
		return res, err
	}
	rctx, stop := context.WithCancel(ctx)
	tdone := make(chan error, 1)
	go func() { tdone <- tl.Run(rctx) }() // owner: keepUp; exits at stop
	defer func() { stop(); <-tdone }()
	deadline := time.Now().Add(latencyReadyWait)
	for tl.State() != tailer.StateStreaming {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("tailer not streaming within %s", latencyReadyWait)
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}

	t0 := time.Now()
	end := t0.Add(d)
	var commits, records atomic.Int64
	var pwg sync.WaitGroup
	perr := make(chan error, latencyProducers)
	for p := range latencyProducers {
		pwg.Add(1)
		go func() { // owner: keepUp; exits at end or on an error
			defer pwg.Done()
			batch := make([]streams.Record, batchSize)
			for i := range batch {
				batch[i] = streams.Record{Stream: stream, Partition: streams.PartitionOf(int32(p)), Data: latencyPayload}
			}
			for time.Now().Before(end) {
				if _, err := env.Client.Produce(ctx, batch...); err != nil {
					perr <- err
					return
				}
				commits.Add(1)
				records.Add(int64(len(batch)))
			}
		}()
	}
	pwg.Wait()
	close(perr)
	if err := <-perr; err != nil {
		return res, err
	}
	produceSecs := time.Since(t0).Seconds()
	// Wait for the tailer to hand on every transaction.
	deadline = time.Now().Add(60 * time.Second)
	for handled.Load() < commits.Load() {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("tailer handed on %d of %d transactions within 60s", handled.Load(), commits.Load())
		}
		time.Sleep(5 * time.Millisecond) // polling interval
	}
	last := time.Unix(0, lastHandled.Load())
	res.Records = records.Load()
	res.Bytes = res.Records * int64(len(latencyPayload))
	res.Seconds = last.Sub(t0).Seconds()
	res.finish()
	res.Note = fmt.Sprintf("%d transactions of %d records appended in %.2fs (%.0f records/s); the tailer handed on the last %.0f ms after the producers stopped",
		commits.Load(), batchSize, produceSecs, float64(res.Records)/produceSecs, (res.Seconds-produceSecs)*1000)
	return res, nil
}

// startGroups starts a group mode's consumers of the stream, woken by hub: one
// consumergroup.Consumer (group-tailer; startGroup), one franz-go group consumer over a
// kafka.Server (kafka-group; startKafkaGroup), or both at once (kafka-paired: the
// franz-go group stamps the lanes' kseen, the native one their seen), each in a group
// of its own. Each partition's first event (offset 0) is an untimed warm-up: a
// consumer's join and first assignment are a rebalance's cost, not delivery latency.
// It returns once every consumer got the warm-up events; each then sends one nil to
// done per lane once every lane's producer stopped and it saw all they produced
// (their goroutines are waited for with wg).
func (s latencyScenario) startGroups(ctx context.Context, env *Env, hub *wakeup.Hub, stream, mode string, lanes []*latencyLane, n int,
	wg *sync.WaitGroup, done chan<- error) error {
	for _, ln := range lanes {
		ln.base = 1 // set before any consumer runs: they read it
	}
	seen := func(ln *latencyLane) []atomic.Int64 { return ln.seen }
	var sts []*groupStamps
	if mode != "kafka-group" {
		st := newGroupStamps(lanes, n, "the group consumer", seen)
		if err := s.startGroup(ctx, env, hub, stream, st, wg); err != nil {
			return err
		}
		sts = append(sts, st)
	}
	if mode != "group-tailer" {
		slot := seen
		if mode == "kafka-paired" {
			slot = func(ln *latencyLane) []atomic.Int64 { return ln.kseen }
		}
		st := newGroupStamps(lanes, n, "the Kafka group consumer", slot)
		if err := s.startKafkaGroup(ctx, env, hub, stream, st, wg); err != nil {
			return err
		}
		sts = append(sts, st)
	}
	for _, ln := range lanes {
		if _, err := env.Client.Produce(ctx, streams.Record{Stream: stream, Partition: streams.PartitionOf(ln.partition), Data: latencyPayload}); err != nil {
			return err
		}
	}
	for _, st := range sts {
		if err := st.await(ctx, wg, done); err != nil {
			return err
		}
	}
	return nil
}

// startGroup starts one consumergroup.Consumer of the stream, woken by hub, whose
// handler stamps each event into st when it is called with it (its goroutine is
// waited for with wg and ends with ctx).
func (latencyScenario) startGroup(ctx context.Context, env *Env, hub *wakeup.Hub, stream string, st *groupStamps, wg *sync.WaitGroup) error {
	pool, err := benchPool(ctx, env, 8)
	if err != nil {
		return err
	}
	c, err := consumergroup.New(pool, &consumergroup.Config{
		Stream: stream, Group: "bench-latency-" + stream, ConsumerID: "latency",
		Wakeups: hub, Logger: quietLogger,
	})
	if err != nil {
		pool.Close()
		return err
	}
	wg.Add(1)
	go func() { // owner: this run; exits when ctx ends (the run's stop)
		defer wg.Done()
		defer pool.Close()
		err := c.Run(ctx, func(ctx context.Context, b *consumergroup.Batch) error {
			now := time.Now().UnixNano()
			for _, ev := range b.Events {
				st.stamp(b.Partition, ev.Offset, now)
			}
			st.check()
			return nil
		})
		if err != nil && ctx.Err() == nil {
			env.Logger.Warn("latency group consumer stopped", "error", err)
		}
	}()
	return nil
}

// groupStamps is what one of a latency mode's group consumers (native or Kafka)
// shares with its run: it stamps each event when the consumer gets it, counts the
// untimed warm-up events, and ends the run once every lane's producer stopped and
// all it produced was seen.
type groupStamps struct {
	lanes       []*latencyLane // by partition
	n           int
	who         string                            // the consumer, for errors
	slot        func(*latencyLane) []atomic.Int64 // where a lane's stamps go (seen, or kseen)
	count, warm atomic.Int64
	warmed      []atomic.Bool // by partition: its warm-up counted once, however often delivered
	all         chan struct{}
	once        sync.Once
}

func newGroupStamps(lanes []*latencyLane, n int, who string, slot func(*latencyLane) []atomic.Int64) *groupStamps {
	return &groupStamps{lanes: lanes, n: n, who: who, slot: slot, warmed: make([]atomic.Bool, len(lanes)), all: make(chan struct{})}
}

// stamp records that the consumer got partition's offset at now (unix ns).
func (g *groupStamps) stamp(partition int32, offset, now int64) {
	ln := g.lanes[partition]
	if offset < ln.base {
		if g.warmed[partition].CompareAndSwap(false, true) {
			g.warm.Add(1)
		}
		return
	}
	if i := offset - ln.base; i < int64(g.n) && g.slot(ln)[i].CompareAndSwap(0, now) {
		g.count.Add(1)
	}
}

// check closes all once every lane's producer stopped and everything it produced
// was seen.
func (g *groupStamps) check() {
	var want int64
	for _, ln := range g.lanes {
		if !ln.finished.Load() {
			return
		}
		want += min(ln.produced.Load(), int64(g.n))
	}
	if g.count.Load() >= want {
		g.once.Do(func() { close(g.all) })
	}
}

// await returns once the consumer got one warm-up event per lane, and starts the goroutine (waited for with wg) that sends one nil to done per
// lane when everything was seen, or ctx's error when ctx ends first.
func (g *groupStamps) await(ctx context.Context, wg *sync.WaitGroup, done chan<- error) error {
	deadline := time.Now().Add(latencyReadyWait)
	for g.warm.Load() < int64(len(g.lanes)) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not get its warm-up events within %s", g.who, latencyReadyWait)
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	wg.Add(1)
	go func() { // owner: this run; exits when every event was seen or ctx ends
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond) // the producers' end is not signalled: look again
		defer tick.Stop()
		for {
			select {
			case <-g.all:
				for range g.lanes {
					done <- nil
				}
				return
			case <-ctx.Done():
				for range g.lanes {
					done <- ctx.Err()
				}
				return
			case <-tick.C:
				g.check()
			}
		}
	}()
	return nil
}
