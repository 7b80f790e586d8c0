package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamd/streamd/internal/backoff"
	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// worker processes one owned partition for one membership: it reads the start
// position, fetches batches in offset order, calls the handler, and commits. It is
// started and owned by the session loop and exits when stopped (after finishing its
// in-flight batch), cancelled (at once; the partition is lost), or fenced.
type worker struct {
	c         *Consumer
	m         *member
	k         *committer // the membership's CommitAuto commits
	partition int32
	h         Handler

	ctx      context.Context // cancelled: lost, or a drain past DrainTimeout; handlers get it
	cancelFn context.CancelFunc
	stopOnce sync.Once
	stopCh   chan struct{} // closed: finish the in-flight batch and exit

	pauseMu sync.Mutex
	paused  bool
	pauseCh chan struct{} // signalled when paused changes

	// inflightSince is the UnixNano start of the running handler call, 0 when idle.
	inflightSince atomic.Int64
	// lost is set when the worker exits without a clean handover (fenced or cancelled).
	lost atomic.Bool
	// fetched counts the handler batches (of MaxBatchSize) fetched, dropped the times
	// that fetched events were dropped unhandled (paused, stopped); read by tests.
	fetched, dropped atomic.Int64
	// redeliverSeen is the Consumer's redeliverGen when the worker last found no
	// redeliveries (-1: not yet looked). Owned by run.
	redeliverSeen int64
}

func newWorker(ctx context.Context, c *Consumer, m *member, k *committer, p int32, h Handler, paused bool) *worker {
	wctx, cancel := context.WithCancel(ctx)
	return &worker{c: c, m: m, k: k, partition: p, h: h, ctx: wctx, cancelFn: cancel,
		stopCh: make(chan struct{}), paused: paused, pauseCh: make(chan struct{}, 1), redeliverSeen: -1}
}

func (w *worker) stop() { w.stopOnce.Do(func() { close(w.stopCh) }) }

// untilStopped returns ctx, cancelled also when the worker is told to stop: retries
// wait on it, so that a revoke does not wait for them (past RebalanceTimeout the
// whole member would be expelled, losing every partition it holds).
func (w *worker) untilStopped(ctx context.Context) (context.Context, context.CancelFunc) {
	sctx, cancel := context.WithCancel(ctx)
	go func() { // owner: the caller, through cancel; exits when sctx ends
		select {
		case <-w.stopCh:
			cancel()
		case <-sctx.Done():
		}
	}()
	return sctx, cancel
}

func (w *worker) cancel() {
	w.lost.Store(true)
	w.stop()
	w.cancelFn()
}

// interrupt cancels a stopped worker's handler ctx without counting the partition as
// lost: a drain ran out of time, but the member still owns the partition and hands it
// over cleanly (its cut-short batch uncommitted).
func (w *worker) interrupt() {
	w.stop()
	w.cancelFn()
}

func (w *worker) setPaused(p bool) {
	w.pauseMu.Lock()
	changed := w.paused != p
	w.paused = p
	w.pauseMu.Unlock()
	if changed {
		select {
		case w.pauseCh <- struct{}{}:
		default:
		}
	}
}

func (w *worker) isPaused() bool {
	w.pauseMu.Lock()
	defer w.pauseMu.Unlock()
	return w.paused
}

func (w *worker) stopping() bool {
	select {
	case <-w.stopCh:
		return true
	default:
		return false
	}
}

func (w *worker) labels() []string {
	return []string{w.c.cfg.Stream, w.c.cfg.Group}
}

// run is the worker's loop; it returns when the worker is stopped, cancelled or fenced.
// A fetch reads up to fetchRecords events (10 handler batches, at most 5,000 and the
// fetch's MaxBytes, 1 MiB; the worker's first fetch one batch, so that the handler
// starts at once), which the handler gets MaxBatchSize at a time. While the
// handler works on them, the next fetch runs (one fetch ahead, so at most two fetches,
// 2 MiB of events, wait per partition): the next position is known before the
// handler returns, since each batch is either done (committed past its end) or ends
// the worker. Events fetched are dropped when the partition is paused, stopped or lost
// meanwhile: none is handed to the handler after the worker was told to stop, so
// nothing of a revoked partition reaches the handler after OnRevoked (the session
// calls it once run returned).
func (w *worker) run() {
	ctx := w.ctx
	defer w.cancelFn()
	defer w.c.metrics.lag.DeleteLabelValues(w.c.cfg.Stream, w.c.cfg.Group, strconv.Itoa(int(w.partition)))
	if w.c.cfg.CommitMode == CommitAuto {
		// Runs after the fetch in flight ended (below): the offsets handed to the
		// committer are written, or refused, before the session hears of the exit.
		defer func() {
			if err := w.k.flush(w); err != nil {
				w.lost.Store(true)
			}
		}()
	}
	// fetchCtx also ends on stop, so an idle long poll does not delay a handover.
	fetchCtx, fetchCancel := context.WithCancel(ctx)
	defer fetchCancel()
	go func() { // owner: run; exits when run returns (fetchCancel) or on stop
		select {
		case <-w.stopCh:
			fetchCancel()
		case <-fetchCtx.Done():
		}
	}()
	var ahead *fetchAhead // the fetch in flight, nil when none
	defer func() { ahead.drop() }()

	pos, reset, err := w.startPosition(ctx)
	for err != nil {
		if ctx.Err() != nil || w.stopping() {
			return
		}
		w.c.log.Warn("read start position failed; retrying", "partition", w.partition, "error", err)
		if !backoff.NewJittered(200*time.Millisecond, time.Second).Wait(fetchCtx) {
			return
		}
		pos, reset, err = w.startPosition(ctx)
	}
	// A position taken from the log's end (or a time) depends on when it was taken:
	// committed now, it holds for whoever owns the partition next, even if this
	// worker stops before its first batch (else the next owner would start at a
	// later end and skip what came between). CommitAuto only: the other modes commit
	// what the program says.
	if reset && w.c.cfg.AutoOffsetReset != ResetEarliest && w.c.cfg.CommitMode == CommitAuto {
		if !w.commit(ctx, pos) {
			return
		}
	}
	fetchBackoff := backoff.NewJittered(50*time.Millisecond, 2*time.Second)
	// With Wakeups, each fetch subscribes to the partition before its first read, so
	// no commit between a read that found nothing and the wait goes unnoticed.
	// The first fetch reads one batch, so that the handler does not wait for a fetch
	// of 5,000 events to start; the fetches after it, which run while the handler
	// works, read fetchRecords.
	opts := streams.FetchOpts{MaxRecords: w.c.cfg.MaxBatchSize, MaxWait: w.c.cfg.FetchMaxWait, Wakeups: w.c.cfg.Wakeups}
	var (
		chunk    []streams.Event // fetched, not handed to the handler yet; starts at pos
		chunkHWM int64           // the log end when chunk was fetched
	)
	for !w.stopping() {
		if w.isPaused() {
			// Paused: what was fetched and not handled is fetched again on resume.
			if ahead.drop() || len(chunk) > 0 {
				w.dropped.Add(1)
			}
			ahead, chunk = nil, nil
			select {
			case <-w.pauseCh:
			case <-w.stopCh:
			}
			continue
		}
		// Redeliveries (dead letters sent back) come before the next batch; the
		// batches fetched, if any, wait for them.
		if !w.redeliverIfAsked(ctx) {
			return
		}
		if len(chunk) == 0 {
			if ahead == nil {
				ahead = w.fetch(fetchCtx, pos, opts)
			}
			res, err := ahead.wait()
			ahead = nil
			if err != nil {
				if w.stopping() || ctx.Err() != nil {
					return
				}
				var oor *streams.OffsetOutOfRangeError
				if errors.As(err, &oor) {
					pos = w.clamp(oor)
					continue
				}
				w.c.log.Warn("fetch failed; retrying", "partition", w.partition, "offset", pos, "error", err)
				fetchBackoff.Wait(fetchCtx)
				continue
			}
			fetchBackoff.Reset()
			w.c.metrics.lag.WithLabelValues(w.c.cfg.Stream, w.c.cfg.Group, strconv.Itoa(int(w.partition))).
				Set(float64(res.HighWatermark - pos))
			if len(res.Events) == 0 {
				continue
			}
			if w.isPaused() || w.stopping() {
				w.dropped.Add(1)
				continue // paused or stopped while fetching: drop the batch, refetch on resume
			}
			chunk, chunkHWM = res.Events, res.HighWatermark
			// The next fetch starts where this one ends, whatever the handler does
			// with its batches: each is done (and committed past its end) or the
			// worker exits.
			opts.MaxRecords = w.c.cfg.fetchRecords()
			ahead = w.fetch(fetchCtx, res.NextOffset, opts)
		}
		// A fetch reads up to fetchRecords; the handler gets them MaxBatchSize at a
		// time, checking for a pause, a stop and redeliveries between two batches.
		n := min(len(chunk), w.c.cfg.MaxBatchSize)
		batch := chunk[:n:n]
		chunk = chunk[n:]
		next, ok := w.process(ctx, batch, chunkHWM)
		if !ok {
			return
		}
		pos = next
		w.c.metrics.lag.WithLabelValues(w.c.cfg.Stream, w.c.cfg.Group, strconv.Itoa(int(w.partition))).
			Set(float64(max(0, chunkHWM-pos)))
	}
}

// fetchAhead is one fetch running on a goroutine of its own, owned by the worker's
// run, which waits for it (wait or drop) before it returns.
type fetchAhead struct {
	cancel context.CancelFunc
	done   chan struct{}
	res    *streams.FetchResult
	err    error
}

// fetch starts a fetch from pos.
func (w *worker) fetch(ctx context.Context, pos int64, opts streams.FetchOpts) *fetchAhead {
	fctx, cancel := context.WithCancel(ctx)
	f := &fetchAhead{cancel: cancel, done: make(chan struct{})}
	go func() { // owner: the worker's run (wait or drop); exits when the fetch returns
		defer close(f.done)
		f.res, f.err = streams.FetchTx(fctx, w.c.pool, w.c.cfg.Stream, w.partition, pos, &opts)
		if f.err == nil && len(f.res.Events) > 0 {
			w.fetched.Add(int64((len(f.res.Events) + w.c.cfg.MaxBatchSize - 1) / w.c.cfg.MaxBatchSize))
		}
	}()
	return f
}

// wait returns the fetch's outcome once it ended.
func (f *fetchAhead) wait() (*streams.FetchResult, error) {
	<-f.done
	f.cancel()
	return f.res, f.err
}

// drop cancels the fetch and waits for it to end; its result is never used. It
// reports whether the fetch had returned events. Nil is a no-op.
func (f *fetchAhead) drop() bool {
	if f == nil {
		return false
	}
	f.cancel()
	<-f.done
	return f.err == nil && len(f.res.Events) > 0
}

// startPosition is the committed offset, else the reset policy's (reset true).
func (w *worker) startPosition(ctx context.Context) (pos int64, reset bool, err error) {
	off, ok, err := committedOffset(ctx, w.c.pool, w.c.cfg.Stream, w.c.cfg.Group, w.partition)
	if err != nil || ok {
		return off, false, err
	}
	w.c.metrics.offsetResets.WithLabelValues(w.c.cfg.Stream, w.c.cfg.Group, "no_commit").Inc()
	pos, err = w.resetPosition(ctx)
	return pos, true, err
}

func (w *worker) resetPosition(ctx context.Context) (int64, error) {
	switch w.c.cfg.AutoOffsetReset {
	case ResetByTime:
		return streams.NewClient(w.c.pool, nil).OffsetForTime(ctx, w.c.cfg.Stream, w.partition, w.c.cfg.ResetTime)
	default:
		var lo, hi int64
		err := w.c.pool.QueryRow(ctx, `SELECT log_start_offset, next_offset FROM streamd.stream_partitions
			WHERE stream_name = $1 AND partition = $2`, w.c.cfg.Stream, w.partition).Scan(&lo, &hi)
		if err != nil {
			return 0, fmt.Errorf("read log bounds of %s/%d: %w", w.c.cfg.Stream, w.partition, sqlerr.Wrap(err))
		}
		if w.c.cfg.AutoOffsetReset == ResetLatest {
			return hi, nil
		}
		return lo, nil
	}
}

// clamp moves a position outside the stored log back into it: below the log start
// (deleted by retention) to the log start; past the log end to the log end.
func (w *worker) clamp(oor *streams.OffsetOutOfRangeError) int64 {
	reason, pos := "below_log_start", oor.LogStartOffset
	if oor.Offset > oor.NextOffset {
		reason, pos = "past_log_end", oor.NextOffset
	}
	w.c.metrics.offsetResets.WithLabelValues(w.c.cfg.Stream, w.c.cfg.Group, reason).Inc()
	w.c.log.Warn("position outside the log; reset", "partition", w.partition, "offset", oor.Offset, "new_offset", pos, "reason", reason)
	return pos
}

// process runs one fetched batch to completion: handler with retries, the error
// policy, and the commit. It returns the next position, and false when the worker
// must exit (stopped while blocked, lost, or fenced).
func (w *worker) process(ctx context.Context, events []streams.Event, hwm int64) (int64, bool) {
	start := time.Now()
	b := w.newBatch(events, hwm)
	err := w.attempt(ctx, b, w.c.cfg.retries())
	if err != nil {
		// Stopped while retrying: the batch stays uncommitted and the partition's
		// next owner gets it again (at-least-once).
		if ctx.Err() != nil || w.lost.Load() || w.stopping() {
			return 0, false
		}
		if w.c.cfg.OnHandlerError == ErrorBlock {
			if !w.block(ctx, b) {
				return 0, false
			}
		} else if _, ok := w.deadLetterEvents(ctx, events, hwm, nil); !ok {
			return 0, false
		}
	}
	next := b.NextOffset()
	switch {
	case w.c.cfg.CommitMode == CommitAuto:
		w.k.add(w, next) // committed asynchronously, coalesced (committer.go)
	case w.c.cfg.CommitMode == CommitTransactional && err != nil:
		// After a dead-lettering pass in transactional mode the handler could not
		// commit the events that failed; commit past them here.
		if !w.commit(ctx, next) {
			return 0, false
		}
	}
	w.c.metrics.batchDuration.WithLabelValues(w.labels()...).Observe(time.Since(start).Seconds())
	return next, true
}

// attempt calls the handler up to 1+retries times (retries < 0: until it succeeds or
// the worker stops), with exponential backoff. It stops retrying once the worker is
// told to stop (a revoke), returning the last error.
func (w *worker) attempt(ctx context.Context, b *Batch, retries int) error {
	bo := backoff.NewJittered(w.c.cfg.RetryBackoff, w.c.cfg.RetryBackoffMax)
	sctx, cancel := w.untilStopped(ctx)
	defer cancel()
	for i := 0; ; i++ {
		err := w.call(ctx, b)
		if err == nil {
			return nil
		}
		w.c.metrics.handlerErrors.WithLabelValues(w.labels()...).Inc()
		w.c.log.Warn("handler failed", "partition", w.partition, "offset", b.Events[0].Offset, "attempt", i+1, "error", err)
		if ctx.Err() != nil || errors.Is(err, ErrFenced) {
			if errors.Is(err, ErrFenced) {
				w.lost.Store(true)
			}
			return err
		}
		if retries >= 0 && i >= retries {
			return err
		}
		if !bo.Wait(sctx) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err // stopped
		}
	}
}

// call runs the handler once, recording the in-flight time for MaxPollInterval.
func (w *worker) call(ctx context.Context, b *Batch) (err error) {
	b.txCommitted = false
	w.inflightSince.Store(time.Now().UnixNano())
	defer w.inflightSince.Store(0)
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	if err := w.h(ctx, b); err != nil {
		err = fencedAtCommit(err)
		if errors.Is(err, ErrAlreadyCommitted) {
			// An earlier attempt's CommitTx committed the batch; this attempt's
			// transaction could not. The batch is done.
			b.txCommitted = true
			return nil
		}
		return err
	}
	if w.c.cfg.CommitMode == CommitTransactional && !b.txCommitted {
		return fmt.Errorf("%w: CommitTransactional: the handler returned nil without calling Batch.CommitTx", ErrInvalidArgument)
	}
	return nil
}

// block retries a failing batch forever at the maximum backoff; it returns false when
// the worker is stopped or cancelled first (the batch stays uncommitted).
func (w *worker) block(ctx context.Context, b *Batch) bool {
	w.c.log.Error("handler keeps failing; partition blocked until it succeeds", "partition", w.partition, "offset", b.Events[0].Offset)
	stopCtx, cancel := w.untilStopped(ctx)
	defer cancel()
	for {
		bo := backoff.NewJittered(w.c.cfg.RetryBackoffMax, w.c.cfg.RetryBackoffMax)
		if !bo.Wait(stopCtx) {
			return false
		}
		if err := w.call(ctx, b); err == nil {
			return true
		} else if ctx.Err() != nil || errors.Is(err, ErrFenced) {
			if errors.Is(err, ErrFenced) {
				w.lost.Store(true) // not a clean handover: OnLost, not OnRevoked
			}
			return false
		}
		w.c.metrics.handlerErrors.WithLabelValues(w.labels()...).Inc()
	}
}

// deadLetterEvents retries a failed batch's events one at a time; each that still
// fails goes to the dead letter queue (fenced like a commit). ids, when set, are the
// events' dead letters (a redelivery), each single-event batch is a redelivery too,
// and handled lists the ids whose event succeeded alone (not dead-lettered again).
func (w *worker) deadLetterEvents(ctx context.Context, events []streams.Event, hwm int64, ids []int64) (handled []int64, ok bool) {
	for i := range events {
		if w.stopping() {
			return handled, false // revoked: the rest go, uncommitted, to the next owner
		}
		one := w.newBatch(events[i:i+1], hwm)
		if ids != nil {
			one.Redelivered, one.DeadLetterIDs = true, ids[i:i+1]
		}
		first := time.Now()
		err := w.attempt(ctx, one, w.c.cfg.retries())
		if err == nil {
			if ids != nil {
				handled = append(handled, ids[i])
			}
			continue
		}
		if ctx.Err() != nil || w.lost.Load() || w.stopping() {
			return handled, false
		}
		e := events[i]
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		var derr error
		// A lost connection or a restarted server is retried, as a commit is;
		// giving up would hand a healthy partition back for a blip.
		for bo := backoff.NewJittered(50*time.Millisecond, time.Second); ; {
			_, derr = w.m.deadLetter(dctx, w.c.pool, w.partition, e.Offset, err.Error(), errorDetail(err), w.c.cfg.retries()+1, first)
			if derr == nil || errors.Is(derr, ErrFenced) || !sqlerr.Retriable(derr) || !bo.Wait(dctx) {
				break
			}
		}
		cancel()
		if derr != nil {
			w.c.log.Error("dead letter failed", "partition", w.partition, "offset", e.Offset, "error", derr)
			if errors.Is(derr, ErrFenced) {
				w.lost.Store(true)
			}
			return handled, false
		}
		w.c.metrics.deadLettered.WithLabelValues(w.labels()...).Inc()
		w.c.log.Warn("event dead-lettered", "partition", w.partition, "offset", e.Offset, "error", err)
		if ids != nil {
			// Pending again: the caller's mark must not name it. The mark's own
			// condition (status 'replayed') does not suffice: a replay made once
			// the record was pending again, before the mark, was marked as done
			// and never redelivered.
			ids[i] = -1
		}
	}
	return handled, true
}

// commit commits next for the partition after a batch, even when ctx was cancelled
// meanwhile (the batch is done; committing it avoids a redelivery).
func (w *worker) commit(ctx context.Context, next int64) bool {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	err := w.c.commitRetry(cctx, w.m, []PartitionOffset{{Partition: w.partition, Offset: next}})
	if err != nil {
		w.c.log.Warn("commit failed; partition dropped", "partition", w.partition, "offset", next, "error", err)
		w.lost.Store(true)
		w.c.signal()
		return false
	}
	return true
}

// fencedAtCommit marks a handler's error ErrFenced when it carries a fencing SQLSTATE
// without matching ErrFenced: the COMMIT of the handler's CommitTx transaction was
// refused (streamd.cg_offsets_check_session, SD108) because this member's session
// ended while the transaction was open, a frozen process woken after its group gave it
// up. pgx returns that refusal as a bare *pgconn.PgError; marked, the worker drops the
// partition as lost instead of retrying a batch whose commits can only be fenced.
func fencedAtCommit(err error) error {
	if errors.Is(err, ErrFenced) || !errors.Is(sqlerr.Wrap(err), ErrFenced) { // the one SQLSTATE table says which codes fence
		return err
	}
	return fmt.Errorf("%w: the handler's transaction was refused at COMMIT: %w", ErrFenced, err)
}
