package consumergroup

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// committer commits the offsets of one membership's CommitAuto batches
// asynchronously, coalesced across its partitions: a worker hands it the offset after
// each batch its handler returned nil for (add) and goes on with the next batch; the
// committer sends what is due as one commit_offsets statement for every partition
// that has something to commit, at most once per Config.CommitInterval. A worker that
// stops (a revoke, the drain, a loss) waits for its partition's last offset to be
// committed or refused (flush) before it exits, so OnRevoked still runs after the
// partition's commits and the release never overtakes them.
//
// G4 holds as before: an offset reaches the committer only after its batch's handler
// returned, so a commit never covers an event not handled. G1 holds as before: every
// statement carries the membership's epoch and is fenced in SQL, all or nothing; when
// a statement of several partitions is fenced, each partition is committed again on
// its own so that only the partitions refused are lost (their workers are cancelled
// and reported lost, as a refused synchronous commit did).
//
// The goroutine (run) is owned by the session that made the committer: it exits when
// stop is called, after committing what is still pending.
type committer struct {
	c        *Consumer
	m        *member
	ctx      context.Context // the session's, without its cancel: commits outlive Run's ctx (the drain)
	interval time.Duration

	mu      sync.Mutex
	pending map[int32]pendingCommit // handled, not sent yet
	sending map[int32]bool          // in the statement in flight
	failed  map[*worker]error       // refused or failed for good; the worker is lost
	waiters []commitWaiter

	kick   chan struct{} // something is pending
	urgent chan struct{} // a flush waits: do not wait out the interval
	quit   chan struct{}
	done   chan struct{}
}

type pendingCommit struct {
	w      *worker
	offset int64
}

type commitWaiter struct {
	w  *worker
	ch chan error
}

func newCommitter(ctx context.Context, c *Consumer, m *member) *committer {
	k := &committer{c: c, m: m, ctx: context.WithoutCancel(ctx), interval: c.cfg.CommitInterval,
		pending: map[int32]pendingCommit{}, sending: map[int32]bool{}, failed: map[*worker]error{},
		kick: make(chan struct{}, 1), urgent: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go k.run() // owner: the session (stop)
	return k
}

func nudge(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// add records that w's handler returned for everything below offset.
func (k *committer) add(w *worker, offset int64) {
	k.mu.Lock()
	k.pending[w.partition] = pendingCommit{w: w, offset: offset}
	k.mu.Unlock()
	nudge(k.kick)
}

// flush waits until nothing of w's partition is pending or in flight, and returns the
// error that refused one of w's commits (nil when all were written).
func (k *committer) flush(w *worker) error {
	k.mu.Lock()
	_, pending := k.pending[w.partition]
	if !pending && !k.sending[w.partition] {
		err := k.failed[w]
		delete(k.failed, w)
		k.mu.Unlock()
		return err
	}
	ch := make(chan error, 1)
	k.waiters = append(k.waiters, commitWaiter{w: w, ch: ch})
	k.mu.Unlock()
	nudge(k.urgent)
	nudge(k.kick)
	return <-ch
}

// stop commits what is pending and ends the goroutine; it returns when it has.
func (k *committer) stop() {
	close(k.quit)
	<-k.done
}

func (k *committer) run() {
	defer close(k.done)
	var last time.Time
	for {
		select {
		case <-k.kick:
		case <-k.quit:
			k.round()
			return
		}
		// Coalesce: what the workers add while the interval runs goes out together.
		if wait := k.interval - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-k.urgent:
			case <-k.quit:
			}
			t.Stop()
		}
		last = time.Now()
		k.round()
	}
}

// round sends everything pending as one statement and settles the waiters.
func (k *committer) round() {
	k.mu.Lock()
	batch := k.pending
	k.pending = map[int32]pendingCommit{}
	for p := range batch {
		k.sending[p] = true
	}
	k.mu.Unlock()

	var refused map[*worker]error
	if len(batch) > 0 {
		refused = k.commit(batch)
	}

	for w, err := range refused {
		// As a refused synchronous commit did: the partition is dropped (OnLost) and
		// its handler, which may be on a later batch already, is cancelled; before
		// the worker's flush returns, so the worker exits lost.
		k.c.log.Warn("commit failed; partition dropped", "partition", w.partition, "error", err)
		w.cancel()
		k.c.signal()
	}

	k.mu.Lock()
	for p := range batch {
		delete(k.sending, p)
	}
	for w, err := range refused {
		k.failed[w] = err
	}
	waiting := k.waiters[:0]
	for _, wt := range k.waiters {
		if _, pending := k.pending[wt.w.partition]; pending || k.sending[wt.w.partition] {
			waiting = append(waiting, wt)
			continue
		}
		wt.ch <- k.failed[wt.w]
		delete(k.failed, wt.w)
	}
	k.waiters = waiting
	k.mu.Unlock()

}

// commit commits batch, retrying connection failures for up to cleanupTimeout, and
// returns the workers whose offsets were refused.
func (k *committer) commit(batch map[int32]pendingCommit) map[*worker]error {
	offsets := make([]PartitionOffset, 0, len(batch))
	for p, pc := range batch {
		offsets = append(offsets, PartitionOffset{Partition: p, Offset: pc.offset})
	}
	slices.SortFunc(offsets, func(a, b PartitionOffset) int { return int(a.Partition - b.Partition) })
	ctx, cancel := context.WithTimeout(k.ctx, cleanupTimeout)
	defer cancel()
	err := k.c.commitRetry(ctx, k.m, offsets)
	if err == nil {
		return nil
	}
	refused := map[*worker]error{}
	if !errors.Is(err, ErrFenced) || len(offsets) == 1 {
		for _, pc := range batch {
			refused[pc.w] = err
		}
		return refused
	}
	// One statement is all or nothing: find the partitions refused, write the others.
	for _, o := range offsets {
		if err := k.c.commitRetry(ctx, k.m, []PartitionOffset{o}); err != nil {
			refused[batch[o.Partition].w] = err
		}
	}
	return refused
}
