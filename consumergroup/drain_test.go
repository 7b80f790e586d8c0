package consumergroup

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// hookCall is one hook call as TestCleanStopDrains records it.
type hookCall struct {
	hook       string
	m          Membership
	partitions []int32
}

// TestCleanStopDrains: cancelling Run's ctx while a CommitTx handler is in flight does
// not cancel the handler's ctx or its transaction: the batch finishes, commits (with
// its effects, once), OnRevoked names the partition with the membership that handled
// the batch, and the member leaves. It used to cancel the handler ("commit batch …
// context canceled"), and the next owner redid the batch.
func TestCleanStopDrains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 5)
	table := pgx.Identifier{testdb.Name("cg_drain")}.Sanitize()
	_, err := pool.Exec(ctx, "CREATE TABLE "+table+` ("offset" bigint PRIMARY KEY)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table) })

	var mu sync.Mutex
	var calls []hookCall
	record := func(name string) Hook {
		return func(_ context.Context, m Membership, ps []int32) {
			mu.Lock()
			calls = append(calls, hookCall{name, m, append([]int32(nil), ps...)})
			mu.Unlock()
		}
	}
	cfg := testConfig(stream, group)
	cfg.CommitMode = CommitTransactional
	cfg.OnAssigned, cfg.OnRevoked, cfg.OnLost = record("assigned"), record("revoked"), record("lost")
	c, err := New(pool, cfg)
	require.NoError(t, err)
	inHandler := make(chan Membership, 1)
	finish := make(chan struct{})
	var handlerErr error
	stop := runConsumer(t, c, func(hctx context.Context, b *Batch) error {
		inHandler <- Membership{b.MemberID, b.MemberEpoch}
		<-finish // the batch's work, still going on when Run is told to stop
		handlerErr = pgx.BeginFunc(hctx, pool, func(tx pgx.Tx) error {
			for _, e := range b.Events {
				if _, err := tx.Exec(hctx, "INSERT INTO "+table+` VALUES ($1)`, e.Offset); err != nil {
					return err
				}
			}
			return b.CommitTx(hctx, tx)
		})
		return handlerErr
	})
	batchOf := <-inHandler
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	waitFor(t, 5*time.Second, "Run to start its drain (the worker told to stop)", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		w := c.owned[0]
		return w != nil && w.stopping()
	})
	require.Empty(t, stopped, "Run returned before its in-flight handler")
	close(finish)
	require.NoError(t, <-stopped)
	require.NoError(t, handlerErr, "the in-flight batch's CommitTx ran under a live ctx")

	off, ok, err := committedOffset(ctx, pool, stream, group, 0)
	require.NoError(t, err)
	require.True(t, ok)
	var effects int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&effects))
	require.Equal(t, off, effects, "the committed offset and the effects agree")
	require.EqualValues(t, 5, off, "the in-flight batch was committed, not left to the next owner")
	var members int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.consumer_registrations
		WHERE stream_name = $1 AND group_id = $2`, stream, group).Scan(&members))
	require.Zero(t, members, "the member left")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []hookCall{{"assigned", batchOf, []int32{0}}, {"revoked", batchOf, []int32{0}}}, calls,
		"the hooks name the membership that handled the batch; a drain is a revoke, not a loss")
}

// TestDrainTimeoutCancelsTheHandler: a handler still running DrainTimeout after Run's
// ctx was cancelled sees its ctx cancelled; its batch is not committed, and the
// partition is still handed over cleanly (OnRevoked, not OnLost).
func TestDrainTimeoutCancelsTheHandler(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 3)
	var hooks hookLog
	cfg := testConfig(stream, group)
	cfg.DrainTimeout = 300 * time.Millisecond
	hooks.attach(cfg)
	c, err := New(pool, cfg)
	require.NoError(t, err)
	inHandler := make(chan struct{})
	var sawCancel bool
	stop := runConsumer(t, c, func(hctx context.Context, b *Batch) error {
		close(inHandler)
		<-hctx.Done() // a handler slower than the drain
		sawCancel = errors.Is(hctx.Err(), context.Canceled)
		return hctx.Err()
	})
	<-inHandler
	start := time.Now()
	require.NoError(t, stop())
	require.GreaterOrEqual(t, time.Since(start), cfg.DrainTimeout, "the handler's ctx lived until the drain timeout")
	require.True(t, sawCancel)
	_, ok, err := committedOffset(context.Background(), pool, stream, group, 0)
	require.NoError(t, err)
	require.False(t, ok, "the cut-short batch is left to the next owner")
	lost, revoked := hooks.get()
	require.Empty(t, lost)
	require.Equal(t, [][]int32{{0}}, revoked)
}

// TestConfigDrainTimeout: a negative DrainTimeout is refused, naming the field.
func TestConfigDrainTimeout(t *testing.T) {
	t.Parallel()
	cfg := testConfig("s", "g")
	cfg.DrainTimeout = -time.Second
	_, err := New(nil, cfg)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorContains(t, err, "DrainTimeout")
	require.Equal(t, 10*time.Second, Config{}.withDefaults().DrainTimeout)
}
