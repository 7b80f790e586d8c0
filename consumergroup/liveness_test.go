package consumergroup

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

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
		mu        sync.Mutex
		lost      [][]int32
		calls     atomic.Int32
		cancelled atomic.Bool
		h         handled
	)
	cfg := testConfig(s, "g")
	cfg.MaxPollInterval = 700 * time.Millisecond
	cfg.OnLost = func(_ context.Context, ps []int32) {
		mu.Lock()
		lost = append(lost, append([]int32(nil), ps...))
		mu.Unlock()
	}
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
	mu.Lock()
	require.NotEmpty(t, lost, "OnLost was called")
	require.Equal(t, []int32{0}, lost[0])
	mu.Unlock()
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
