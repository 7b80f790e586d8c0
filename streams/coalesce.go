package streams

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// coalescedAppends counts calls appended in a transaction shared with other calls
// (tests check the path was taken).
var coalescedAppends atomic.Int64

// coalesceMax is the most records a Produce call may hold to share a transaction:
// larger calls run alone. A shared transaction saves a commit and a round trip per
// call (~200 µs of server CPU), which is most of a one-record call's cost and little
// of a 100-record call's, while it runs the calls' statements one after another on
// one backend instead of side by side: measured at 4 producers on 2 cores, 6-23% less
// server CPU per record at batch 1, and a lower rate at batch 100 (bench/RESULTS.md,
// session 11).
const coalesceMax = 16

// appendQueue coalesces the concurrent one-partition Produce calls of one Client, as
// a Kafka producer does: at most max transactions of them run at once; a call that
// arrives while max are in flight waits, and when one of them ends, the calls that
// waited meanwhile (up to insertMax records) are appended together in one transaction,
// one statement per call sent in one round trip (a pipeline ending in one Sync, so one
// implicit transaction and one commit). A Produce call then shares its commit and its
// round trip with others, which at a few records per call is most of its cost
// (bench/RESULTS.md, issue 21 §2).
//
// Each call keeps its own all-or-nothing result: its records are one statement. If
// any statement of a shared transaction fails, the whole transaction rolls back and
// every call in it is appended again alone, as it would have been without
// coalescing, so one call's bad records or duplicate event ids fail only that call.
// Retrying is safe after an unknown outcome too (a connection lost at commit): every
// record has its event id before it is queued, so a record already stored is found
// by its id (L4). A call the statement declines (a stream with per-key versions, a
// payload over the limit) wrote nothing and goes through streamd.append() alone.
//
// Concurrency: no goroutine of its own. The goroutine of a call that starts a
// transaction (the leader) first lets the calls ready to run join it (collect), sends
// it, wakes the calls it appended, then hands the calls that waited meanwhile to the
// goroutine of the first of them, which becomes the next leader. A waiting call whose
// ctx ends before a leader took it leaves the queue and returns ctx's error, having
// written nothing. A shared transaction runs under a context that ends when the ctx of
// any of its calls ends: the transaction then rolls back and every call is appended
// again alone under its own ctx, so a call whose ctx ended returns its error as it
// would have alone, and no call waits past its deadline for another's (a statement
// waiting for a head row another transaction holds, say). A leader that panics first
// sends the calls it took to be appended alone and hands on, so no call and no slot is
// stranded. The statements of a shared transaction lock head rows in (stream,
// partition) order, the order every multi-partition append takes.
type appendQueue struct {
	pool *pgxpool.Pool
	max  int
	// hard bounds the transactions running, stalled ones included: the pool's
	// connections (or max, if more).
	hard int
	// stallAfter is appendStallAfter (tests that hold a transaction on a lock to
	// make calls wait set it longer).
	stallAfter time.Duration

	mu       sync.Mutex
	inFlight int           // transactions of this queue running
	stalled  int           // of them, those running for over appendStallAfter
	pending  []*appendCall // calls waiting, in arrival order
}

// appendStallAfter is how long a transaction of the queue runs before it no longer
// counts against max. A shared transaction commits in a few milliseconds; one that
// runs this long waits for something (a head row another transaction holds: a long
// ProduceTx, a lock taken by hand), and its calls' partitions are not the waiting
// calls'. Without it, two calls blocked on one partition's head row held both
// default slots, and every small call of the Client, to any stream, waited behind
// them while the pool had connections to spare (TestBlockedAppendsDoNotStallOtherStreams).
// With it, such calls wait at most this long for a transaction of their own, up to
// hard: where a transaction per call would have waited for a connection anyway.
const appendStallAfter = 50 * time.Millisecond

// txWatch is one running transaction of the queue (its leader's), marked stalled by
// its timer after appendStallAfter. Its fields are guarded by appendQueue.mu.
type txWatch struct {
	timer   *time.Timer
	stalled bool
	ended   bool
}

// appendCall is one Produce call in the queue. The fields after done are written by
// the leader that took the call before it closes done, and read by the call's
// goroutine after.
type appendCall struct {
	ctx       context.Context // the caller's: a shared transaction ends with it
	stream    string
	partition int32
	recs      []Record
	st        insertStatement
	done      chan struct{}

	next  callNext
	batch []*appendCall // next == callLead: the calls to append, this one first
	pos   []Position
	err   error
}

// callNext is what a call's goroutine does once its done channel is closed.
type callNext int

const (
	callFinished callNext = iota // pos and err are the call's result
	callLead                     // append batch, then hand on
	callAlone                    // the shared transaction failed: append alone
	callAppend                   // declined: append through streamd.append()
)

func newAppendQueue(pool *pgxpool.Pool, inFlight int) *appendQueue {
	hard := inFlight
	if pool != nil {
		hard = max(hard, int(pool.Config().MaxConns))
	}
	return &appendQueue{pool: pool, max: inFlight, hard: hard, stallAfter: appendStallAfter}
}

// canStartLocked reports whether a call may start a transaction now: fewer than max
// run that are not stalled, and fewer than hard in all. q.mu must be held.
func (q *appendQueue) canStartLocked() bool {
	return q.inFlight-q.stalled < q.max && q.inFlight < q.hard
}

// watch starts the stall timer of a transaction that starts now. w.timer is read
// only by the goroutine that leads the transaction (handOn), after this returns; the
// timer's function reads the fields that q.mu guards.
func (q *appendQueue) watch() *txWatch {
	w := &txWatch{}
	w.timer = time.AfterFunc(q.stallAfter, func() { q.stall(w) })
	return w
}

// stall marks w's transaction stalled (it no longer counts against max) and, when
// calls wait and a transaction may start, hands them to the first of them to lead.
func (q *appendQueue) stall(w *txWatch) {
	q.mu.Lock()
	if w.ended {
		q.mu.Unlock()
		return
	}
	w.stalled = true
	q.stalled++
	if len(q.pending) == 0 || !q.canStartLocked() {
		q.mu.Unlock()
		return
	}
	q.inFlight++
	batch := q.takePendingLocked()
	q.mu.Unlock()
	batch[0].next, batch[0].batch = callLead, batch
	close(batch[0].done)
}

// produce appends recs (one stream and partition, every event id set, at most
// coalesceMax records) in a transaction of their own or shared with other calls.
func (q *appendQueue) produce(ctx context.Context, stream string, partition int32, recs []Record) ([]Position, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("append to %s: %w", stream, err)
	}
	c := &appendCall{ctx: ctx, stream: stream, partition: partition, recs: recs, done: make(chan struct{})}
	if q.takeSlot() {
		return q.lead(ctx, c, []*appendCall{c})
	}
	// Every slot is in use: the call may share a transaction, which needs its
	// statement. Built only now, off the lock, so that a call running alone (most
	// calls) builds it once, in appendOwnTx.
	st, err := newInsertStatement(stream, partition, recs)
	if err != nil {
		return nil, err
	}
	c.st = st
	q.mu.Lock()
	if q.canStartLocked() { // a slot came free meanwhile
		q.inFlight++
		q.mu.Unlock()
		return q.lead(ctx, c, []*appendCall{c})
	}
	q.pending = append(q.pending, c)
	q.mu.Unlock()
	select {
	case <-c.done:
	case <-ctx.Done():
		q.mu.Lock()
		if i := slices.Index(q.pending, c); i >= 0 {
			q.pending = slices.Delete(q.pending, i, i+1)
			q.mu.Unlock()
			return nil, fmt.Errorf("append to %s: %w", stream, ctx.Err())
		}
		q.mu.Unlock()
		<-c.done // taken by a leader: its outcome decides
	}
	return q.finish(ctx, c)
}

// takeSlot takes a transaction slot if one is free.
func (q *appendQueue) takeSlot() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.canStartLocked() {
		q.inFlight++
		return true
	}
	return false
}

// finish does what the leader that took c left to c's goroutine.
func (q *appendQueue) finish(ctx context.Context, c *appendCall) ([]Position, error) {
	switch c.next {
	case callLead:
		return q.lead(ctx, c, c.batch)
	case callAlone:
		return appendOwnTx(ctx, q.pool, c.stream, c.recs)
	case callAppend:
		return appendBatch(ctx, q.pool, c.stream, c.recs)
	}
	return c.pos, c.err
}

// lead appends batch (own among it, with the calls collect adds) in one transaction,
// wakes the others of batch, hands on to the calls that waited meanwhile and returns
// own's result.
func (q *appendQueue) lead(ctx context.Context, own *appendCall, batch []*appendCall) ([]Position, error) {
	w := q.watch()
	batch = q.collect(own, batch)
	if len(batch) == 1 {
		// Alone: today's path, statement and fallbacks unchanged.
		defer q.handOn(w)
		return appendOwnTx(ctx, q.pool, own.stream, own.recs)
	}
	panicked := q.appendSharedUntilAnyEnds(batch)
	// Wake the others first, then hand on: a caller that produces again at once
	// (a producer's loop) finds this slot still taken and waits, so it goes in the
	// next transaction with the calls that waited meanwhile (see collect).
	for _, c := range batch {
		if c != own {
			close(c.done)
		}
	}
	q.handOn(w)
	if panicked != nil {
		panic(panicked)
	}
	return q.finish(ctx, own)
}

// collectYields bounds how often a leader yields to let calls join its transaction.
const collectYields = 4

// collect adds to batch (led by own) the calls that queue while the leader yields the
// processor, until a yield brings none (at most collectYields times, up to insertMax
// records). A yield lets the goroutines that are ready to run do so first, without a
// timer (a Kafka producer's batching without its linger): the callers the last
// transaction just woke, which produce again at once, join this one instead of
// queueing for the next, so concurrent callers do not split into alternating small
// transactions. With nothing else ready to run, a yield returns at once.
func (q *appendQueue) collect(own *appendCall, batch []*appendCall) []*appendCall {
	records := 0
	for _, c := range batch {
		records += len(c.recs)
	}
	for range collectYields {
		runtime.Gosched()
		q.mu.Lock()
		n := 0
		for n < len(q.pending) && records+len(q.pending[n].recs) <= insertMax {
			records += len(q.pending[n].recs)
			n++
		}
		if n > 0 && own.st.sql == "" {
			// own took a free slot, and so has no statement yet.
			st, err := newInsertStatement(own.stream, own.partition, own.recs)
			if err != nil { // own fails alone, as it would have
				q.mu.Unlock()
				return batch
			}
			own.st = st
		}
		batch = append(batch, q.pending[:n]...)
		q.pending = slices.Delete(q.pending, 0, n)
		q.mu.Unlock()
		if n == 0 {
			break
		}
	}
	return batch
}

// appendSharedUntilAnyEnds runs appendShared under a context that ends when the ctx
// of any call of batch ends (the transaction then fails and every call is appended
// alone, under its own ctx). If appendShared panics, every call is sent to be
// appended alone and the panic's value is returned, for the leader to raise once it
// has handed on and woken the others. A panic after the batch went out leaves its
// outcome unknown (it may have committed): a call appended again alone then finds
// its own records and answers their positions as duplicates (Position.Duplicate).
func (q *appendQueue) appendSharedUntilAnyEnds(batch []*appendCall) (panicked any) {
	bctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	defer cancel()
	for _, c := range batch {
		stop := context.AfterFunc(c.ctx, cancel)
		defer stop()
	}
	defer func() {
		if panicked = recover(); panicked != nil {
			for _, c := range batch {
				c.next, c.pos, c.err = callAlone, nil, nil
			}
		}
	}()
	q.appendShared(bctx, batch)
	return nil
}

// appendShared appends batch in one transaction: one statement per call, in (stream,
// partition) order, pipelined in one round trip. It sets every call's next: finished
// with its positions, or to be appended alone (the transaction failed and rolled
// back), or through streamd.append() (its statement declined and wrote nothing).
func (q *appendQueue) appendShared(ctx context.Context, batch []*appendCall) {
	calls := slices.Clone(batch)
	slices.SortStableFunc(calls, func(a, b *appendCall) int {
		return cmp.Or(cmp.Compare(a.stream, b.stream), cmp.Compare(a.partition, b.partition))
	})
	b := &pgx.Batch{}
	for _, c := range calls {
		b.Queue(c.st.sql, c.st.args...)
	}
	br := q.pool.SendBatch(ctx, b)
	defer func() {
		// A panic while reading the results (a tracer's, a scan's) must still give the
		// batch's connection back to the pool; the results are read to the end first,
		// so the connection is left at a statement boundary.
		if br != nil {
			_ = br.Close()
		}
	}()
	var failed error
	for _, c := range calls {
		c.next = callFinished
		row := &seenRow{row: br.QueryRow()}
		var ok bool
		c.pos, ok, c.err = c.st.scan(row, c.stream, c.partition)
		if row.err != nil {
			// Any failed statement (a duplicate id included, which scan reports as
			// ok=false) rolls back the whole transaction.
			failed = row.err
			break
		}
		if !ok && c.err == nil { // declined: no offset, nothing written
			c.next = callAppend
		}
	}
	err := br.Close()
	br = nil
	if failed == nil && err != nil {
		failed = err
	}
	if failed == nil {
		coalescedAppends.Add(int64(len(calls)))
		return
	}
	for _, c := range calls {
		c.next, c.pos, c.err = callAlone, nil, nil
	}
}

// handOn ends w's transaction: it gives the calls that waited (up to insertMax
// records, at least one call) to the goroutine of the first of them, or, with none
// waiting, ends this transaction slot.
func (q *appendQueue) handOn(w *txWatch) {
	q.mu.Lock()
	w.timer.Stop()
	w.ended = true
	if w.stalled {
		q.stalled--
	}
	if len(q.pending) == 0 {
		q.inFlight--
		q.mu.Unlock()
		return
	}
	batch := q.takePendingLocked()
	q.mu.Unlock()
	batch[0].next, batch[0].batch = callLead, batch
	close(batch[0].done)
}

// takePendingLocked takes the calls that waited longest, up to insertMax records and
// at least one call. q.mu must be held and a call pending.
func (q *appendQueue) takePendingLocked() []*appendCall {
	n, records := 0, 0
	for n < len(q.pending) && (n == 0 || records+len(q.pending[n].recs) <= insertMax) {
		records += len(q.pending[n].recs)
		n++
	}
	batch := slices.Clone(q.pending[:n])
	q.pending = slices.Delete(q.pending, 0, n)
	return batch
}

// seenRow is a pgx.Row that keeps the error of its Scan, other than no row.
type seenRow struct {
	row pgx.Row
	err error
}

func (r *seenRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if !errors.Is(err, pgx.ErrNoRows) {
		// No row is a declined statement (insert.go), which failed nothing: the
		// transaction goes on and commits the other calls' rows.
		r.err = err
	}
	return err
}
