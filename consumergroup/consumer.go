package consumergroup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/backoff"
	"github.com/streamd/streamd/internal/sqlerr"
)

// Handler processes one batch of one partition. Batches of a partition are delivered
// one at a time, in offset order; batches of different partitions run concurrently.
// Return nil when the batch is done (in CommitAuto mode its offset is then committed,
// asynchronously: Config.CommitInterval);
// an error retries it (see Config.MaxRetries and Config.OnHandlerError). ctx is not
// Run's: cancelling Run's ctx lets the call finish and commit (Config.DrainTimeout).
// ctx is cancelled when the partition is lost (fenced, expired, MaxPollInterval
// overrun) and when a clean stop's DrainTimeout runs out; a call that sees it
// cancelled should return, and its batch goes uncommitted to the next owner.
type Handler func(ctx context.Context, b *Batch) error

// cleanupTimeout bounds the work done after cancellation (final commit, hooks'
// context, leave group).
const cleanupTimeout = 10 * time.Second

// errRejoin ends a session that must join again (fenced, lost session, poll timeout).
var errRejoin = errors.New("rejoin")

// Consumer is one member of a consumer group. New makes it; Run joins the group and
// processes the partitions the group assigns to it until its context is cancelled.
// Commit, Pause, Resume and Assignment may be called from any goroutine while Run runs.
type Consumer struct {
	pool *pgxpool.Pool
	// sessionPool carries the membership's own statements (join, heartbeat, release,
	// leave) on at most two connections of its own, made from pool's configuration
	// while Run runs: handlers that hold every connection of pool (long CommitTx
	// transactions, many partitions) must not delay heartbeats past the session
	// timeout and get a healthy member expelled (Kafka's heartbeat thread, for the
	// same reason). Set by Run before the session starts; read by its goroutines.
	sessionPool *pgxpool.Pool
	cfg         Config
	unset       unsetFields // the fields the stream's settings may fill (streamsettings.go)
	log         *slog.Logger
	metrics     *metrics

	running atomic.Bool
	// wake is signalled (never blocking) by the listener and by workers to make the
	// session loop heartbeat at once.
	wake chan struct{}
	// redeliverGen grows whenever dead letters may have been replayed to the group
	// (the group's channel said 'redeliver', or the listener reconnected and may have
	// missed it); each worker looks for redeliveries when it sees a new value
	// (redeliver.go).
	redeliverGen atomic.Int64

	mu     sync.Mutex
	member *member           // the current membership; nil between sessions
	owned  map[int32]*worker // the partitions being processed now

	// hooks are a test's (Config.hooks); nil in a program.
	hooks *testHooks
}

// New returns a Consumer of cfg.Stream in cfg.Group. It does no I/O; Run joins. A nil
// cfg is an empty Config (Stream and Group are required, so it fails). It fails with
// ErrInvalidArgument naming the first bad field.
func New(pool *pgxpool.Pool, c *Config) (*Consumer, error) {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	unset := unsetOf(cfg)
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Consumer{
		pool:    pool,
		cfg:     cfg,
		unset:   unset,
		log:     cfg.Logger.With("stream", cfg.Stream, "group", cfg.Group),
		metrics: m,
		wake:    make(chan struct{}, 1),
		owned:   map[int32]*worker{},
		hooks:   cfg.hooks,
	}, nil
}

// Run joins the group and processes assigned partitions with h until ctx is
// cancelled, then stops cleanly and returns nil: the batches in flight finish and
// commit (at most Config.DrainTimeout), OnRevoked runs, and the member leaves the
// group so that its partitions move to the other members at once. It
// survives lost connections and database restarts (joining again with backoff) and
// rejoins after being fenced. It returns an error only for a condition retrying cannot
// fix (the stream does not exist, an invalid name), when called twice at once, and
// with ErrInstanceFenced when another live member took over its InstanceID.
func (c *Consumer) Run(ctx context.Context, h Handler) error {
	if h == nil {
		return fmt.Errorf("%w: consumergroup: Run needs a handler", ErrInvalidArgument)
	}
	if !c.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: consumergroup: Run is already running", ErrInvalidArgument)
	}
	defer c.running.Store(false)
	c.applyStreamSettings(ctx)

	scfg := c.pool.Config()
	scfg.MaxConns, scfg.MinConns = 2, 0
	sp, err := pgxpool.NewWithConfig(ctx, scfg) // connects on first use
	if err != nil {
		return fmt.Errorf("consumergroup: session pool: %w", err)
	}
	c.sessionPool = sp
	defer sp.Close()

	lctx, stopListener := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owner: Run; exits when Run returns (stopListener)
		defer wg.Done()
		c.listen(lctx)
	}()
	defer wg.Wait()
	defer stopListener()

	bo := backoff.NewJittered(100*time.Millisecond, 5*time.Second)
	for {
		m, err := c.join(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			if sqlerr.Retriable(err) {
				c.log.Warn("join failed; retrying", "error", err)
				if !bo.Wait(ctx) {
					return nil
				}
				continue
			}
			return err
		}
		bo.Reset()
		c.log.Info("joined group", "member_id", m.consumerID, "member_epoch", m.epoch)
		err = c.session(ctx, m, h)
		if ctx.Err() != nil || c.hooks.isKilled() {
			return nil
		}
		if holder := c.instanceTakenOver(ctx, m, err); holder != "" {
			c.log.Warn("instance id taken over by another member; stopping", "member_id", m.consumerID,
				"instance_id", m.instanceID, "holder_id", holder)
			return fmt.Errorf("%w: consumergroup: instance id %q of group %s of %s now belongs to member %s: %w",
				ErrInstanceFenced, m.instanceID, m.group, m.stream, holder, err)
		}
		c.log.Info("rejoining group", "member_id", m.consumerID, "reason", err)
	}
}

func (c *Consumer) join(ctx context.Context) (*member, error) {
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	id := c.cfg.ConsumerID + "-" + hex.EncodeToString(suffix)
	return memberJoin(ctx, c.sessionPool, c.cfg.Stream, c.cfg.Group, id, c.cfg.InstanceID,
		c.cfg.SessionTimeout, c.cfg.RebalanceTimeout, nil)
}

// instanceTakenOver returns the member that holds m's instance id now, when m (a
// static member) ended its session fenced and another member with a live session
// holds that instance id: a second process runs with the same InstanceID, or this
// one was replaced by a restart while it still ran. Joining again would take the
// partitions back and fence the other in turn, both handling them meanwhile, forever
// (Kafka's FENCED_INSTANCE_ID stops the old member for the same reason). "" when m is
// dynamic, was not fenced, or nobody live holds the instance id (its own session
// expired: a rejoin is right), and when the check fails (the rejoin is the safe side:
// if the instance is taken, the next fencing asks again).
func (c *Consumer) instanceTakenOver(ctx context.Context, m *member, sessionErr error) string {
	if m.instanceID == "" || !errors.Is(sessionErr, ErrFenced) {
		return ""
	}
	qctx, cancel := context.WithTimeout(ctx, c.cfg.SessionTimeout)
	defer cancel()
	holder, err := instanceHolder(qctx, c.sessionPool, m.stream, m.group, m.instanceID)
	if err != nil {
		c.log.Warn("cannot tell who holds the instance id; rejoining", "error", err)
		return ""
	}
	if holder == m.consumerID {
		return ""
	}
	return holder
}

// signal wakes the session loop without blocking.
func (c *Consumer) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// session runs one membership: heartbeats, reconciles the assignment with the running
// partition workers, and calls the hooks. It owns the workers: every worker it starts
// has exited when it returns.
func (c *Consumer) session(ctx context.Context, m *member, h Handler) error {
	c.mu.Lock()
	c.member = m
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.member = nil
		c.mu.Unlock()
	}()

	// The membership's CommitAuto commits; every worker flushed its own before it
	// exited, so stop finds nothing left when the session ends.
	k := newCommitter(ctx, c, m)
	defer k.stop()
	done := make(chan *worker, 64)
	workers := map[int32]*worker{} // running or stopping
	lastOK := time.Now()
	ticker := time.NewTicker(c.cfg.HeartbeatInterval)
	defer ticker.Stop()
	c.signal() // learn the assignment at once, not one interval after joining

	setOwned := func() {
		c.mu.Lock()
		c.owned = maps(workers)
		c.mu.Unlock()
	}
	// finish waits for every worker, then reports them as revoked (clean) or lost. A
	// clean finish (the drain) lets in-flight handlers run on with a live ctx for
	// DrainTimeout, then cancels it.
	finish := func(clean bool) {
		running := make([]*worker, 0, len(workers))
		for _, w := range workers {
			running = append(running, w)
			if clean {
				w.stop()
			} else {
				w.cancel()
			}
		}
		if clean && len(running) > 0 {
			drain := time.AfterFunc(c.cfg.DrainTimeout, func() { // owner: finish (Stop below)
				c.log.Warn("drain timeout: cancelling the handlers still running", "member_id", m.consumerID,
					"drain_timeout", c.cfg.DrainTimeout)
				for _, w := range running {
					w.interrupt()
				}
			})
			defer drain.Stop()
		}
		var revoked, lost []int32
		for len(workers) > 0 {
			w := <-done
			delete(workers, w.partition)
			if clean && !w.lost.Load() {
				revoked = append(revoked, w.partition)
			} else {
				lost = append(lost, w.partition)
			}
		}
		setOwned()
		if c.hooks.isKilled() {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		c.hook(cctx, c.cfg.OnRevoked, "revoked", m, revoked)
		c.hook(cctx, c.cfg.OnLost, "lost", m, lost)
	}

	for {
		select {
		case <-ctx.Done():
			c.shutdown(ctx, m, finish)
			return ctx.Err()
		case w := <-done:
			delete(workers, w.partition)
			setOwned()
			if w.lost.Load() {
				hbOK, _ := c.whileHeartbeating(ctx, m, func() {
					c.hook(ctx, c.cfg.OnLost, "lost", m, []int32{w.partition})
				})
				lastOK = latest(lastOK, hbOK) // a fencing shows at the next heartbeat
				continue
			}
			// A clean stop: the coordinator asked for it because the partition is
			// being revoked. Hand it over.
			var err error
			hbOK, _ := c.whileHeartbeating(ctx, m, func() {
				c.hook(ctx, c.cfg.OnRevoked, "revoked", m, []int32{w.partition})
				err = m.release(ctx, c.sessionPool, []int32{w.partition}, nil)
			})
			lastOK = latest(lastOK, hbOK) // a fencing fails the release (below)
			if err != nil {
				c.log.Warn("release failed", "partition", w.partition, "error", err)
				if errors.Is(err, ErrFenced) {
					c.metrics.rebalances.WithLabelValues(c.cfg.Stream, c.cfg.Group, "fenced").Inc()
					finish(false)
					return fmt.Errorf("%w: %w", errRejoin, err)
				}
			}
			c.signal()
			continue
		case <-ticker.C:
		case <-c.wake:
		}

		if stuck := c.stuckWorker(workers); stuck != nil {
			c.log.Warn("handler exceeded MaxPollInterval; leaving the group", "partition", stuck.partition,
				"max_poll_interval", c.cfg.MaxPollInterval)
			c.metrics.rebalances.WithLabelValues(c.cfg.Stream, c.cfg.Group, "poll_timeout").Inc()
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			if _, err := m.leave(lctx, c.sessionPool, nil); err != nil {
				c.log.Warn("leave failed", "error", err)
			}
			cancel()
			finish(false)
			return fmt.Errorf("%w: poll interval exceeded", errRejoin)
		}

		c.hooks.heartbeat()
		hctx, cancel := context.WithTimeout(ctx, c.cfg.SessionTimeout)
		a, err := m.heartbeat(hctx, c.sessionPool, nil)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				continue // shutdown next iteration
			}
			if errors.Is(err, ErrFenced) || time.Since(lastOK) > c.cfg.SessionTimeout {
				c.log.Warn("member fenced; dropping partitions", "member_id", m.consumerID, "error", err)
				c.metrics.rebalances.WithLabelValues(c.cfg.Stream, c.cfg.Group, "fenced").Inc()
				finish(false)
				return fmt.Errorf("%w: %w", errRejoin, err)
			}
			c.log.Warn("heartbeat failed; retrying", "error", err)
			continue
		}
		lastOK = time.Now()
		lastOK = latest(lastOK, c.reconcile(ctx, m, k, h, a, workers, done))
		setOwned()
	}
}

// reconcile starts workers for newly assigned partitions, stops those being revoked,
// cancels those no longer owned, and applies pauses. It returns the time of the last
// heartbeat that succeeded while its releases and OnAssigned ran (zero when none).
func (c *Consumer) reconcile(ctx context.Context, m *member, k *committer, h Handler, a Assignment, workers map[int32]*worker, done chan *worker) time.Time {
	var added, releaseNow []int32
	for _, p := range a.Assigned {
		w, running := workers[p]
		revoking := slices.Contains(a.Revoking, p)
		switch {
		case running && revoking:
			w.stop()
		case running:
			w.setPaused(slices.Contains(a.Paused, p))
		case revoking:
			releaseNow = append(releaseNow, p) // never started: nothing to finish
		default:
			added = append(added, p)
		}
	}
	for p, w := range workers {
		if !slices.Contains(a.Assigned, p) {
			w.lost.Store(true)
			w.cancel()
		}
	}
	if len(releaseNow) == 0 && len(added) == 0 {
		return time.Time{}
	}
	hbOK, fenced := c.whileHeartbeating(ctx, m, func() {
		if len(releaseNow) > 0 {
			if err := m.release(ctx, c.sessionPool, releaseNow, nil); err != nil {
				c.log.Warn("release failed", "partitions", releaseNow, "error", err)
			}
		}
		c.hook(ctx, c.cfg.OnAssigned, "assigned", m, added)
	})
	if fenced {
		// The membership ended while OnAssigned ran: the partitions are no longer
		// this member's. Starting their workers would run handlers (whose commits are
		// refused) until the session loop's next heartbeat; it heartbeats now instead,
		// is refused, and rejoins.
		c.signal()
		return hbOK
	}
	for _, p := range added {
		// Not Run's ctx: a clean stop drains the worker (finish) rather than cancel it.
		w := newWorker(context.WithoutCancel(ctx), c, m, k, p, h, slices.Contains(a.Paused, p))
		workers[p] = w
		go func() { // owner: session; exits on stop/cancel; reported on done
			w.run()
			done <- w
		}()
	}
	return hbOK
}

// shutdown ends a session because Run's context was cancelled (the drain): workers
// finish their in-flight batches with a live handler ctx (cancelled after
// DrainTimeout) and commit them, OnRevoked runs, and the member leaves, so its
// partitions move at once (a static member stays registered until its session
// expires or it restarts).
func (c *Consumer) shutdown(ctx context.Context, m *member, finish func(clean bool)) {
	// Heartbeats go on while the in-flight batches finish, commit and OnRevoked runs:
	// a handler slower than the session timeout would otherwise get the member
	// expelled mid-handover, its final commits refused and its batches redelivered.
	// At most MaxPollInterval: a handler that ignores its ctx (cancelled at
	// DrainTimeout) longer than that must not keep the partitions from the others.
	_, _ = c.whileHeartbeating(context.WithoutCancel(ctx), m, func() { finish(true) })
	if c.hooks.isKilled() || c.cfg.InstanceID != "" {
		return
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := m.leave(lctx, c.sessionPool, nil); err != nil {
		c.log.Warn("leave failed", "error", err)
	} else {
		c.log.Info("left group", "member_id", m.consumerID)
	}
}

// whileHeartbeating runs fn on the calling goroutine (the session loop, the only
// heartbeat sender otherwise) while a goroutine of its own heartbeats every
// HeartbeatInterval, for at most MaxPollInterval, and returns the time of the last
// heartbeat that succeeded (zero when none) and whether one was refused because the
// membership ended (ErrFenced; the heartbeats stop then). fn is a hook, a release or a shutdown's
// wait for its workers: one slower than the session timeout must not get a healthy
// member expelled, after which it would rejoin, run the hook again and be expelled
// again. Past MaxPollInterval the heartbeats stop, as for a stuck handler, so a hook
// that never returns cannot keep its partitions from the others. The assignments the
// heartbeats return are dropped: the session loop's next heartbeat reconciles.
func (c *Consumer) whileHeartbeating(ctx context.Context, m *member, fn func()) (time.Time, bool) {
	hbCtx, stop := context.WithTimeout(ctx, c.cfg.MaxPollInterval)
	var lastOK atomic.Int64
	var fenced atomic.Bool
	hbDone := make(chan struct{})
	go func() { // owner: whileHeartbeating; ends when fn returned (stop) or after MaxPollInterval
		defer close(hbDone)
		t := time.NewTicker(c.cfg.HeartbeatInterval)
		defer t.Stop()
		for {
			select {
			case <-hbCtx.Done():
				return
			case <-t.C:
				c.hooks.heartbeat()
				hctx, cancel := context.WithTimeout(hbCtx, c.cfg.SessionTimeout)
				_, err := m.heartbeat(hctx, c.sessionPool, nil)
				cancel()
				switch {
				case err == nil:
					lastOK.Store(time.Now().UnixNano())
				case errors.Is(err, ErrFenced):
					fenced.Store(true)
					c.log.Warn("member fenced while a hook or handover runs", "error", err)
					return // no heartbeat can succeed for this membership any more
				case hbCtx.Err() == nil:
					c.log.Warn("heartbeat while a hook or handover runs failed", "error", err)
				}
			}
		}
	}()
	fn()
	stop()
	<-hbDone
	if ns := lastOK.Load(); ns != 0 {
		return time.Unix(0, ns), fenced.Load()
	}
	return time.Time{}, fenced.Load()
}

// latest is the later of two times.
func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (c *Consumer) stuckWorker(workers map[int32]*worker) *worker {
	for _, w := range workers {
		if since := w.inflightSince.Load(); since != 0 && time.Since(time.Unix(0, since)) > c.cfg.MaxPollInterval {
			return w
		}
	}
	return nil
}

// hook calls fn for m's partitions with a context that ends after MaxPollInterval
// (Config.OnAssigned).
func (c *Consumer) hook(ctx context.Context, fn Hook, reason string, m *member, partitions []int32) {
	if len(partitions) == 0 {
		return
	}
	slices.Sort(partitions)
	c.metrics.rebalances.WithLabelValues(c.cfg.Stream, c.cfg.Group, reason).Inc()
	c.log.Info("partitions "+reason, "partitions", partitions, "member_id", m.consumerID, "member_epoch", m.epoch)
	if fn != nil {
		hctx, cancel := context.WithTimeout(ctx, c.cfg.MaxPollInterval)
		defer cancel()
		fn(hctx, Membership{MemberID: m.consumerID, MemberEpoch: m.epoch}, partitions)
	}
}

// Commit commits offsets (the next offset to read) for partitions this member owns,
// all or nothing. ErrFenced when it does not own one of them at its current epoch;
// ErrNotOwned when Run is not in a session.
func (c *Consumer) Commit(ctx context.Context, offsets ...PartitionOffset) error {
	c.mu.Lock()
	m := c.member
	c.mu.Unlock()
	if m == nil {
		return fmt.Errorf("%w: consumer is not a member of group %s now", ErrNotOwned, c.cfg.Group)
	}
	return c.commitRetry(ctx, m, offsets)
}

// commitRetry commits, retrying connection failures with backoff until ctx ends; a
// retried commit carries the same epoch, so it stays fenced.
func (c *Consumer) commitRetry(ctx context.Context, m *member, offsets []PartitionOffset) error {
	b := backoff.NewJittered(50*time.Millisecond, time.Second)
	for {
		err := m.commit(ctx, c.pool, offsets, nil)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrFenced) {
			c.metrics.fencedCommits.WithLabelValues(c.cfg.Stream, c.cfg.Group).Inc()
			return err
		}
		if !sqlerr.Retriable(err) || !b.Wait(ctx) {
			return err
		}
	}
}

// Pause stops the group processing partitions (whichever member owns them, across
// handovers) until Resume. An in-flight batch finishes.
func (c *Consumer) Pause(ctx context.Context, partitions ...int32) error {
	return setPaused(ctx, c.pool, c.cfg.Stream, c.cfg.Group, partitions, true, true)
}

// Resume undoes Pause.
func (c *Consumer) Resume(ctx context.Context, partitions ...int32) error {
	return setPaused(ctx, c.pool, c.cfg.Stream, c.cfg.Group, partitions, false, true)
}

// Assignment returns the partitions this member processes now, ascending.
func (c *Consumer) Assignment() []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int32, 0, len(c.owned))
	for p := range c.owned {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

func maps(m map[int32]*worker) map[int32]*worker {
	out := make(map[int32]*worker, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
