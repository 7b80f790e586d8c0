package consumergroup

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestRevokeCommitsBeforeOnRevokedAndDeliversNothingAfter: member a handles 4
// partitions with a batch always fetched ahead while its handler works, and commits
// only when it must (CommitInterval of an hour: no periodic commit). When b joins,
// each partition revoked from a is committed up to the end of the last batch a handled
// before OnRevoked runs (the pending asynchronous commit is flushed first), nothing
// of it reaches a's handler after OnRevoked (the batch fetched ahead is dropped), and
// b starts exactly there: no event of the handover is handled twice.
func TestRevokeCommitsBeforeOnRevokedAndDeliversNothingAfter(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 4)
	group := testdb.Name("g")
	pos := produce(t, pool, stream, 0, 400)
	// A producer keeps the partitions busy until the handover is over.
	stopProducing := make(chan struct{})
	producerDone := make(chan struct{})
	var more []streams.Position
	go func() {
		defer close(producerDone)
		for i := 400; ; i += 20 {
			select {
			case <-stopProducing:
				return
			case <-time.After(10 * time.Millisecond): // pacing, not a wait
			}
			more = append(more, produce(t, pool, stream, i, 20)...)
		}
	}()

	var mu sync.Mutex
	var h handled
	lastEnd := map[int32]int64{}        // a's last handled batch end per partition
	revokedAt := map[int32]int64{}      // the committed offset OnRevoked saw
	handledAfter := map[int32][]int64{} // a's batches that started after OnRevoked
	revoked := map[int32]bool{}
	handler := func(name string) Handler {
		return func(ctx context.Context, b *Batch) error {
			mu.Lock()
			if name == "a" && revoked[b.Partition] {
				handledAfter[b.Partition] = append(handledAfter[b.Partition], b.Events[0].Offset)
			}
			mu.Unlock()
			time.Sleep(3 * time.Millisecond) // simulated work, so that a fetch is always ahead
			for _, e := range b.Events {
				h.add(e.Partition, e.Offset)
			}
			if name == "a" {
				mu.Lock()
				lastEnd[b.Partition] = b.NextOffset()
				mu.Unlock()
			}
			return nil
		}
	}
	cfgA := testConfig(stream, group)
	cfgA.MaxBatchSize = 5
	cfgA.CommitInterval = time.Hour
	cfgA.OnRevoked = func(ctx context.Context, _ Membership, ps []int32) {
		for _, p := range ps {
			off, _, err := committedOffset(ctx, pool, stream, group, p)
			if err != nil {
				t.Errorf("read committed offset: %v", err)
			}
			mu.Lock()
			revoked[p] = true
			revokedAt[p] = off
			mu.Unlock()
		}
	}
	a, err := New(pool, cfgA)
	require.NoError(t, err)
	stopA := runConsumer(t, a, handler("a"))
	waitFor(t, 5*time.Second, "a owns 4 and is handling", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(a.Assignment()) == 4 && len(lastEnd) == 4
	})

	cfgB := testConfig(stream, group)
	cfgB.MaxBatchSize = 5
	var firstB sync.Map // partition -> first offset b handled
	b, err := New(pool, cfgB)
	require.NoError(t, err)
	hb := handler("b")
	runConsumer(t, b, func(ctx context.Context, batch *Batch) error {
		firstB.LoadOrStore(batch.Partition, batch.Events[0].Offset)
		return hb(ctx, batch)
	})
	waitFor(t, 10*time.Second, "2 and 2", func() bool { return len(a.Assignment()) == 2 && len(b.Assignment()) == 2 })
	movedToB := b.Assignment()
	waitFor(t, 10*time.Second, "b handling both", func() bool {
		_, ok0 := firstB.Load(movedToB[0])
		_, ok1 := firstB.Load(movedToB[1])
		return ok0 && ok1
	})
	close(stopProducing)
	<-producerDone
	pos = append(pos, more...)
	require.NoError(t, stopA()) // a's clean stop revokes (and commits) the other two
	waitFor(t, 10*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, revokedAt, 4, "2 partitions revoked by the rebalance, 2 by a's stop")
	for p := int32(0); p < 4; p++ {
		require.Equal(t, lastEnd[p], revokedAt[p], "partition %d: committed before OnRevoked up to a's last batch", p)
		require.Empty(t, handledAfter[p], "partition %d: batches handed to a after OnRevoked", p)
	}
	for _, p := range movedToB {
		first, ok := firstB.Load(p)
		require.True(t, ok, "partition %d: b handled nothing", p)
		require.Equal(t, revokedAt[p], first, "partition %d: b starts where a committed", p)
	}
	h.requireAll(t, pos)
}

// TestPausedPartitionDropsTheBatchFetchedAhead: a partition paused while its handler
// runs (a batch already fetched ahead) hands nothing more to the handler until it is
// resumed, and then nothing is skipped.
func TestPausedPartitionDropsTheBatchFetchedAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	pos := produce(t, pool, stream, 0, 40)
	var h handled
	inFirst := make(chan struct{})
	release := make(chan struct{})
	var calls atomic.Int32
	var whilePaused atomic.Int32
	var paused atomic.Bool
	cfg := testConfig(stream, group)
	cfg.MaxBatchSize = 5
	c, err := New(pool, cfg)
	require.NoError(t, err)
	runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		if calls.Add(1) == 1 {
			close(inFirst)
			<-release
		} else if paused.Load() {
			whilePaused.Add(1)
		}
		for _, e := range b.Events {
			h.add(e.Partition, e.Offset)
		}
		return nil
	})
	<-inFirst
	// The next batch is fetched while the first one's handler waits.
	worker := func() *worker {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.owned[0]
	}
	waitFor(t, 5*time.Second, "a batch fetched ahead", func() bool { w := worker(); return w != nil && w.fetched.Load() >= 2 })
	require.NoError(t, c.Pause(ctx, 0))
	waitFor(t, 5*time.Second, "worker paused", func() bool { w := worker(); return w != nil && w.isPaused() })
	paused.Store(true)
	close(release)
	waitFor(t, 5*time.Second, "the batch fetched ahead dropped", func() bool { return worker().dropped.Load() >= 1 })
	require.Zero(t, whilePaused.Load(), "batches handled while paused")
	require.EqualValues(t, 1, calls.Load())
	paused.Store(false)
	require.NoError(t, c.Resume(ctx, 0))
	waitFor(t, 10*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })
	h.requireAll(t, pos)
}

// TestCoalescedCommitFencedWritesNothing: the committer's one statement for several
// partitions, at a stale epoch, writes nothing for any of them, and every worker is
// told it is fenced (and cancelled: its partitions are lost); with the current epoch
// but one partition moved to another member, the partitions still owned are written
// and only the moved one is refused.
func TestCoalescedCommitFencedWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 4)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 40)
	a := join(t, pool, stream, group, "a")
	owned := settle(t, pool, []*member{a})
	require.Len(t, owned["a"], 4)
	c, err := New(pool, testConfig(stream, group))
	require.NoError(t, err)
	noop := func(context.Context, *Batch) error { return nil }

	commitAll := func(m *member, ps []int32) map[int32]error {
		k := newCommitter(ctx, c, m)
		defer k.stop()
		ws := make([]*worker, len(ps))
		for i, p := range ps {
			ws[i] = newWorker(ctx, c, m, k, p, noop, false)
			k.add(ws[i], 1)
		}
		out := map[int32]error{}
		for _, w := range ws {
			out[w.partition] = k.flush(w)
			require.Equal(t, out[w.partition] != nil, w.lost.Load(), "partition %d: refused means lost", w.partition)
			if out[w.partition] != nil {
				require.Error(t, w.ctx.Err(), "partition %d: a refused worker is cancelled", w.partition)
			}
		}
		return out
	}
	stale := &member{stream: stream, group: group, consumerID: a.consumerID, epoch: a.epoch - 1}
	for p, err := range commitAll(stale, []int32{0, 1, 2, 3}) {
		require.ErrorIs(t, err, ErrFenced, "partition %d", p)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.consumer_offsets WHERE stream_name = $1 AND group_id = $2`,
		stream, group).Scan(&n))
	require.Zero(t, n, "a fenced coalesced commit wrote offsets")

	// b joins and takes partitions; a releases them, so one of them is b's now.
	b := join(t, pool, stream, group, "b")
	owned = settle(t, pool, []*member{a, b})
	require.Len(t, owned["b"], 2)
	errs := commitAll(a, []int32{0, 1, 2, 3})
	for p := int32(0); p < 4; p++ {
		off, ok, err := committedOffset(ctx, pool, stream, group, p)
		require.NoError(t, err)
		if slices.Contains(owned["b"], p) {
			require.ErrorIs(t, errs[p], ErrFenced, "partition %d (b's)", p)
			require.False(t, ok, "partition %d (b's) written", p)
			continue
		}
		require.NoError(t, errs[p], "partition %d (a's)", p)
		require.True(t, ok && off == 1, fmt.Sprintf("partition %d (a's): committed %v at %d", p, ok, off))
	}
}

// TestFetchReadsTenBatchesAndHandsThemOneAtATime: a partition's fetch reads ten
// handler batches at once (its first fetch one; the next fetch runs ahead), while
// the handler gets them MaxBatchSize at a time, in offset order, nothing skipped or
// repeated.
func TestFetchReadsTenBatchesAndHandsThemOneAtATime(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	pos := produce(t, pool, stream, 0, 120)
	cfg := testConfig(stream, group)
	cfg.MaxBatchSize = 5
	c, err := New(pool, cfg)
	require.NoError(t, err)
	release := make(chan struct{})
	var mu sync.Mutex
	var next int64 // the offset the next batch must start at
	var bad []string
	var h handled
	var calls atomic.Int32
	runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		if calls.Add(1) == 1 {
			<-release
		}
		mu.Lock()
		defer mu.Unlock()
		if len(b.Events) > cfg.MaxBatchSize || b.Events[0].Offset != next {
			bad = append(bad, fmt.Sprintf("batch of %d from %d, expected at most %d from %d", len(b.Events), b.Events[0].Offset, cfg.MaxBatchSize, next))
		}
		next = b.NextOffset()
		for _, e := range b.Events {
			h.add(e.Partition, e.Offset)
		}
		return nil
	})
	worker := func() *worker {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.owned[0]
	}
	// While the first batch's handler waits: the first fetch (one batch, so that the
	// handler starts at once) and the fetch ahead, of ten batches.
	waitFor(t, 5*time.Second, "a fetch of one batch and one of ten", func() bool { w := worker(); return w != nil && w.fetched.Load() >= 11 })
	close(release)
	waitFor(t, 10*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })
	h.requireAll(t, pos)
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, bad)
	require.EqualValues(t, 120, next)
}
