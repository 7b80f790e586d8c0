package consumergroup

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streamconfig"
)

// A group takes the defaults it was not given from the stream's configuration:
// performance_config.batchSize bounds its batches, and dead_letter_config (enabled,
// one attempt) dead-letters an event its handler fails on instead of blocking the
// partition; a value set in Config wins.
func TestStreamSettingsAct(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	produce(t, pool, stream, 0, 10)
	require.NoError(t, streamconfig.NewStore(pool).Set(ctx, stream, &streamconfig.Config{
		Performance: &streamconfig.Performance{BatchSize: 3},
		DeadLetter:  &streamconfig.DeadLetter{Enabled: true, MaxDeliveryAttempts: 1},
	}))

	run := func(group string, cfg Config) (maxBatch int) {
		t.Helper()
		cfg.Stream, cfg.Group = stream, group
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		c, err := New(pool, &cfg)
		require.NoError(t, err)
		var mu sync.Mutex
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- c.Run(rctx, func(_ context.Context, b *Batch) error {
				mu.Lock()
				maxBatch = max(maxBatch, len(b.Events))
				mu.Unlock()
				for _, e := range b.Events {
					if e.Offset == 4 {
						return errors.New("poison")
					}
				}
				return nil
			})
		}()
		waitFor(t, 20*time.Second, "the group to catch up", func() bool { return groupLag(t, pool, stream, group) == 0 })
		cancel()
		require.NoError(t, <-done)
		mu.Lock()
		defer mu.Unlock()
		return maxBatch
	}

	group := testdb.Name("g")
	require.Equal(t, 3, run(group, Config{}), "batches of the stream's batchSize")
	var dead []int64
	rows, err := pool.Query(ctx, `SELECT "offset" FROM streamd.dead_letter_queue WHERE stream_name = $1 AND group_id = $2`, stream, group)
	require.NoError(t, err)
	for rows.Next() {
		var o int64
		require.NoError(t, rows.Scan(&o))
		dead = append(dead, o)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{4}, dead, "the stream's dead-letter policy applied")

	// Config wins: a batch size given is kept.
	require.Equal(t, 10, run(testdb.Name("g"), Config{MaxBatchSize: 100, OnHandlerError: ErrorDeadLetter, MaxRetries: NoRetries}))
}
