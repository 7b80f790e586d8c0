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
		if mode == "tailer" || mode == "group-tailer" || mode == "kafka-group" {
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

	// One lane per partition: a producer (one event per transaction, paced at its
	// share of latencyRate; a commit that waits for its WAL flush takes longer than
	// 1ms, and appends to one partition serialise) and a reader.
	n := int(d/time.Second*latencyRate/latencyProducers) + latencyRate
	lanes := make([]*latencyLane, latencyProducers)
	for i := range lanes {
		lanes[i] = &latencyLane{partition: int32(i), acked: make([]atomic.Int64, n), seen: make([]atomic.Int64, n)}
	}
	readersDone := make(chan error, len(lanes))
	switch mode {
	case "group-tailer":
		if err := s.startGroup(rctx, env, hub, stream, lanes, n, &wg, readersDone); err != nil {
			return nil, err
		}
	case "kafka-group": // the kafka scenario's (kafka_scenario.go)
		if err := s.startKafkaGroup(rctx, env, hub, stream, lanes, n, &wg, readersDone); err != nil {
			return nil, err
		}
	default:
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
	perr := make(chan error, len(lanes))
	for _, ln := range lanes {
		pwg.Add(1)
		go func() { // owner: this run; exits at end, or on ctx or an error
			defer pwg.Done()
			defer ln.finished.Store(true)
			tick := time.NewTicker(time.Second * latencyProducers / latencyRate)
			defer tick.Stop()
			for time.Now().Before(end) && int(ln.produced.Load()) < n {
				select {
				case <-ctx.Done():
					perr <- ctx.Err()
					return
				case <-tick.C:
				}
				off, err := s.produce(ctx, env, stream, ln.partition, mode)
				if err != nil {
					perr <- err
					return
				}
				if i := off - ln.base; i >= 0 && i < int64(n) {
					ln.acked[i].Store(time.Now().UnixNano())
				}
				ln.produced.Add(1)
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
	for range lanes {
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
	rate := fmt.Sprintf("%d events at %.0f/s (paced at %d/s)", total, float64(total)/elapsed.Seconds(), latencyRate)
	op := "commit returned → fetch returned the event"
	switch mode {
	case "group-tailer":
		op = "commit returned → the group's handler called with the event"
	case "kafka-group":
		op = "commit returned → a franz-go group consumer's poll returned the event (over a kafka.Server woken by the tailer)"
	}
	res := timingResult("latency", mode, name, mode == "listen", params, op, samples)
	res.Note = fmt.Sprintf("%s; %d seen before the producer's commit returned (counted as 0)", rate, early)
	out := []Result{res}
	if hub != nil && mode != "group-tailer" && mode != "kafka-group" {
		wr := timingResult("latency", mode+"-wakeup", name+" wake-up", mode == "listen", params,
			"commit returned → reader woken, or the event fetched if sooner", wakeSamples)
		wr.Note = rate
		out = append(out, wr)
	}
	return out, nil
}

// latencyLane is one partition's producer and reader.
type latencyLane struct {
	partition int32
	base      int64          // the offset of the lane's first timed event (after warm-up events)
	acked     []atomic.Int64 // unix ns when the producer's commit returned, by offset - base
	seen      []atomic.Int64 // unix ns when the reader's fetch returned it, by offset
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

// startGroup starts one consumergroup.Consumer of the stream, woken by hub, whose
// handler stamps each event when it is called with it; it sends one nil to done per
// lane once every lane's producer stopped and the handler saw all it produced, and
// returns after the consumer has started (its goroutine is waited for with wg).
func (latencyScenario) startGroup(ctx context.Context, env *Env, hub *wakeup.Hub, stream string, lanes []*latencyLane, n int,
	wg *sync.WaitGroup, done chan<- error) error {
	pool, err := benchPool(ctx, env, 8)
	if err != nil {
		return err
	}
	c, err := consumergroup.New(pool, &consumergroup.Config{
		Stream: stream, Group: "bench-latency-" + env.RunID, ConsumerID: "latency",
		Wakeups: hub, Logger: quietLogger,
	})
	if err != nil {
		pool.Close()
		return err
	}
	// One warm-up event per partition, not timed: the consumer's join and first
	// assignment are a rebalance's cost, not delivery latency.
	for _, ln := range lanes {
		if _, err := env.Client.Produce(ctx, streams.Record{Stream: stream, Partition: streams.PartitionOf(ln.partition), Data: latencyPayload}); err != nil {
			pool.Close()
			return err
		}
		ln.base = 1
	}
	st := newGroupStamps(lanes, n)
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
	return st.await(ctx, wg, done, "the group consumer")
}

// groupStamps is what a latency mode's group consumer (native or Kafka) shares with
// its run: it stamps each event when the consumer gets it, counts the untimed warm-up
// events, and ends the run once every lane's producer stopped and all it produced
// was seen.
type groupStamps struct {
	lanes      []*latencyLane // by partition
	n          int
	seen, warm atomic.Int64
	all        chan struct{}
	once       sync.Once
}

func newGroupStamps(lanes []*latencyLane, n int) *groupStamps {
	return &groupStamps{lanes: lanes, n: n, all: make(chan struct{})}
}

// stamp records that the consumer got partition's offset at now (unix ns).
func (g *groupStamps) stamp(partition int32, offset, now int64) {
	ln := g.lanes[partition]
	if offset < ln.base {
		g.warm.Add(1)
		return
	}
	if i := offset - ln.base; i < int64(g.n) && ln.seen[i].CompareAndSwap(0, now) {
		g.seen.Add(1)
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
	if g.seen.Load() >= want {
		g.once.Do(func() { close(g.all) })
	}
}

// await returns once the consumer (who, for the error) got one warm-up event per
// lane, and starts the goroutine (waited for with wg) that sends one nil to done per
// lane when everything was seen, or ctx's error when ctx ends first.
func (g *groupStamps) await(ctx context.Context, wg *sync.WaitGroup, done chan<- error, who string) error {
	deadline := time.Now().Add(latencyReadyWait)
	for g.warm.Load() < int64(len(g.lanes)) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not get its warm-up events within %s", who, latencyReadyWait)
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
