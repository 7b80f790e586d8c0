package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// hookLog records the partitions a consumer's OnLost and OnRevoked hooks name.
type hookLog struct {
	mu            sync.Mutex
	lost, revoked [][]int32
}

// attach sets cfg's OnLost and OnRevoked to record into h.
func (h *hookLog) attach(cfg *Config) {
	record := func(to *[][]int32) Hook {
		return func(_ context.Context, _ Membership, ps []int32) {
			h.mu.Lock()
			*to = append(*to, append([]int32(nil), ps...))
			h.mu.Unlock()
		}
	}
	cfg.OnLost, cfg.OnRevoked = record(&h.lost), record(&h.revoked)
}

// get returns copies of what was recorded so far.
func (h *hookLog) get() (lost, revoked [][]int32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([][]int32(nil), h.lost...), append([][]int32(nil), h.revoked...)
}

// TestStuckHandlerGivesUpPartitions (processing liveness, Kafka's max.poll.interval):
// a handler stuck past MaxPollInterval makes its member leave the group, its handler
// context is cancelled, OnLost names the partitions, and after rejoining the
// uncommitted batch is delivered again and handled: nothing is lost.
func TestStuckHandlerGivesUpPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	s := testdb.Name("stuck")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, s, 1))
	pos := produce(t, pool, s, 0, 5)

	var (
		hooks     hookLog
		calls     atomic.Int32
		cancelled atomic.Bool
		h         handled
	)
	cfg := testConfig(s, "g")
	cfg.MaxPollInterval = 700 * time.Millisecond
	hooks.attach(cfg)
	c, err := New(pool, cfg)
	require.NoError(t, err)
	cancel := runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		if calls.Add(1) == 1 {
			// Stuck until the member gives up and cancels the handler's context.
			<-ctx.Done()
			cancelled.Store(true)
			return ctx.Err()
		}
		for _, e := range b.Events {
			h.add(e.Partition, e.Offset)
		}
		return nil
	})
	waitFor(t, 20*time.Second, "the stuck batch to be lost and delivered again", func() bool {
		return groupLag(t, pool, s, "g") == 0
	})
	require.True(t, cancelled.Load(), "the stuck handler's context was cancelled")
	lost, _ := hooks.get()
	require.NotEmpty(t, lost, "OnLost was called")
	require.Equal(t, []int32{0}, lost[0])
	require.GreaterOrEqual(t, calls.Load(), int32(2), "the uncommitted batch was delivered again")
	h.requireAll(t, pos)
	require.NoError(t, cancel())
}

// TestCommittedOffsetBelowLogStartResetsToLogStart: when retention deleted records the
// group had not read, the group resumes at the log start (not at an error, not at the
// log end) and counts the reset.
func TestCommittedOffsetBelowLogStartResetsToLogStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	s := testdb.Name("belowstart")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, s, 1))
	produce(t, pool, s, 0, 10)

	// The group read offsets 0 and 1, then went away.
	cfg := testConfig(s, "g")
	c, err := New(pool, cfg)
	require.NoError(t, err)
	stop := runConsumer(t, c, func(ctx context.Context, b *Batch) error { return nil })
	waitFor(t, 20*time.Second, "the group to commit", func() bool { return groupLag(t, pool, s, "g") == 0 })
	require.NoError(t, stop())
	_, err = NewAdmin(pool).ResetOffsets(ctx, s, "g", ResetOpts{Mode: ResetToOffset, Value: 2})
	require.NoError(t, err)
	// Retention keeps the newest 4: the log now starts at 6.
	_, err = pool.Exec(ctx, "SELECT streamd.apply_size_retention($1, 4)", s)
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	c, err = New(pool, cfg)
	require.NoError(t, err)
	var mu sync.Mutex
	var offsets []int64
	stop = runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range b.Events {
			offsets = append(offsets, e.Offset)
		}
		return nil
	})
	waitFor(t, 20*time.Second, "the group to catch up", func() bool { return groupLag(t, pool, s, "g") == 0 })
	require.NoError(t, stop())
	mu.Lock()
	require.Equal(t, []int64{6, 7, 8, 9}, offsets, "resumed at the log start")
	mu.Unlock()
	require.Equal(t, 1.0, testutil.ToFloat64(c.metrics.offsetResets.WithLabelValues(s, "g", "below_log_start")))
}

// TestRevokeStopsRetries: a member retrying a failing batch without end (MaxRetries
// -1) hands a revoked partition over at the revoke, without waiting for its retries;
// it used to go on retrying past RebalanceTimeout and be expelled, losing (OnLost)
// every partition it held.
func TestRevokeStopsRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	s := testdb.Name("revokeretry")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, s, 2))
	produce(t, pool, s, 0, 20)

	var hooks hookLog
	cfg := testConfig(s, "g")
	cfg.MaxRetries = -1
	cfg.RebalanceTimeout = 4 * time.Second
	hooks.attach(cfg)
	a, err := New(pool, cfg)
	require.NoError(t, err)
	stopA := runConsumer(t, a, func(context.Context, *Batch) error { return errors.New("always fails") })
	waitFor(t, 20*time.Second, "a to own both partitions", func() bool { return len(a.Assignment()) == 2 })

	cfgB := testConfig(s, "g")
	cfgB.MaxRetries = -1
	b, err := New(pool, cfgB)
	require.NoError(t, err)
	stopB := runConsumer(t, b, func(context.Context, *Batch) error { return errors.New("always fails") })
	start := time.Now()
	waitFor(t, 20*time.Second, "the partitions shared", func() bool {
		return len(a.Assignment()) == 1 && len(b.Assignment()) == 1
	})
	require.Less(t, time.Since(start), cfg.RebalanceTimeout, "handed over at the revoke, not at RebalanceTimeout")
	lost, _ := hooks.get()
	require.Empty(t, lost, "a was never expelled")
	require.NoError(t, stopB())
	require.NoError(t, stopA())
}

// TestFencedWhileBlockedIsLost: under ErrorBlock, a handler that reports ErrFenced
// (its CommitTx was fenced) while the batch is blocked ends the partition as lost
// (OnLost), not as a clean handover (OnRevoked: another member may own it already).
func TestFencedWhileBlockedIsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	s := testdb.Name("blockfenced")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, s, 1))
	produce(t, pool, s, 0, 3)

	var (
		hooks hookLog
		calls atomic.Int32
	)
	cfg := testConfig(s, "g")
	cfg.MaxRetries = 1
	cfg.OnHandlerError = ErrorBlock
	hooks.attach(cfg)
	c, err := New(pool, cfg)
	require.NoError(t, err)
	stop := runConsumer(t, c, func(context.Context, *Batch) error {
		switch calls.Add(1) {
		case 1, 2: // the first try and its retry
			return errors.New("fails")
		case 3: // blocked, retried: fenced
			return fmt.Errorf("commit: %w", ErrFenced)
		}
		return nil
	})
	waitFor(t, 20*time.Second, "the fenced partition reported", func() bool {
		lost, revoked := hooks.get()
		return len(lost) > 0 || len(revoked) > 0
	})
	lost, revoked := hooks.get()
	require.Equal(t, [][]int32{{0}}, lost, "OnLost")
	require.Empty(t, revoked, "not OnRevoked")
	require.NoError(t, stop())
}

// TestRebalanceTimeoutFollowsMaxPollInterval: by default a member may keep a
// partition through a rebalance as long as its batch may run (MaxPollInterval), as in
// Kafka; it was a fixed 60s, so a 2-minute batch within a 5-minute MaxPollInterval got
// its member expelled whenever a rebalance caught it.
func TestRebalanceTimeoutFollowsMaxPollInterval(t *testing.T) {
	t.Parallel()
	require.Equal(t, 5*time.Minute, Config{}.withDefaults().RebalanceTimeout)
	require.Equal(t, 2*time.Minute, Config{MaxPollInterval: 2 * time.Minute}.withDefaults().RebalanceTimeout)
	require.Equal(t, 7*time.Second, Config{RebalanceTimeout: 7 * time.Second}.withDefaults().RebalanceTimeout)
}

// TestResetLatestPositionIsCommitted: a group starting at the log's end commits that
// position when it takes the partition, so a member that stops before its first batch
// does not make the next owner start at a later end and skip what came between.
func TestResetLatestPositionIsCommitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	s := testdb.Name("resetlatest")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, s, 1))
	produce(t, pool, s, 0, 5) // offsets 0-4, before the group: not for it

	cfg := testConfig(s, "g")
	cfg.AutoOffsetReset = ResetLatest
	a, err := New(pool, cfg)
	require.NoError(t, err)
	stopA := runConsumer(t, a, func(context.Context, *Batch) error { return nil })
	waitFor(t, 20*time.Second, "the start position committed", func() bool {
		off, ok, err := committedOffset(ctx, pool, s, "g", 0)
		require.NoError(t, err)
		return ok && off == 5
	})
	require.NoError(t, stopA())

	produce(t, pool, s, 5, 3) // offsets 5-7, while no member runs
	var h handled
	b, err := New(pool, cfg)
	require.NoError(t, err)
	stopB := runConsumer(t, b, func(_ context.Context, bt *Batch) error {
		for _, e := range bt.Events {
			h.add(e.Partition, e.Offset)
		}
		return nil
	})
	waitFor(t, 20*time.Second, "offsets 5-7 handled", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.seen[[2]int64{0, 5}] > 0 && h.seen[[2]int64{0, 6}] > 0 && h.seen[[2]int64{0, 7}] > 0
	})
	h.mu.Lock()
	require.Zero(t, h.seen[[2]int64{0, 4}], "nothing from before the group")
	h.mu.Unlock()
	require.NoError(t, stopB())
}

// TestShutdownHeartbeatsWhileBatchesFinish: a member shutting down keeps its session
// alive while an in-flight batch, slower than the session timeout, finishes: the batch
// is committed and handed over cleanly (OnRevoked, not OnLost). It used to stop
// heartbeating, was expelled mid-handover, and its final commit was refused.
func TestShutdownHeartbeatsWhileBatchesFinish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	s := testdb.Name("slowclose")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, s, 1))
	produce(t, pool, s, 0, 3)

	var hooks hookLog
	cfg := testConfig(s, "g") // SessionTimeout 1.5s
	hooks.attach(cfg)
	c, err := New(pool, cfg)
	require.NoError(t, err)
	inHandler := make(chan struct{})
	var once sync.Once
	stop := runConsumer(t, c, func(context.Context, *Batch) error {
		once.Do(func() { close(inHandler) })
		time.Sleep(3 * time.Second) // ignores its cancelled ctx, outlives the session timeout
		return nil
	})
	<-inHandler
	require.NoError(t, stop())
	off, ok, err := committedOffset(ctx, pool, s, "g", 0)
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, 3, off, "the slow batch was committed")
	lost, revoked := hooks.get()
	require.Empty(t, lost)
	require.Equal(t, [][]int32{{0}}, revoked)
}

// TestHeartbeatsWithTheHandlerPoolExhausted: a handler that holds every connection of
// the consumer's pool for longer than the session timeout (within MaxPollInterval)
// does not get its member expelled: the membership has connections of its own. Its
// heartbeats used to wait for the pool, and the member lost its partitions (OnLost).
func TestHeartbeatsWithTheHandlerPoolExhausted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfgDB := testdb.Config(t)
	cfgDB.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfgDB)
	require.NoError(t, err)
	defer pool.Close()
	s := testdb.Name("poolhog")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, s, 1))
	produce(t, pool, s, 0, 2)

	var (
		hooks hookLog
		done  atomic.Int32
	)
	cfg := testConfig(s, "g") // SessionTimeout 1.5s
	hooks.attach(cfg)
	c, err := New(pool, cfg)
	require.NoError(t, err)
	stop := runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		if done.Load() > 0 {
			return nil
		}
		var held []*pgxpool.Conn
		for range 2 { // every connection of the pool
			conn, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			held = append(held, conn)
		}
		time.Sleep(3 * time.Second)
		for _, conn := range held {
			conn.Release()
		}
		done.Add(1)
		return nil
	})
	waitFor(t, 20*time.Second, "the batch committed", func() bool { return groupLag(t, pool, s, "g") == 0 && done.Load() > 0 })
	lost, _ := hooks.get()
	require.Empty(t, lost, "the member kept its partition")
	require.NoError(t, stop())
}
