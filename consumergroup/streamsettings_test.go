package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
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

// dead_letter_config.stream acts: a group's dead letter is also appended to that
// stream, with its provenance in headers, in the dead-lettering transaction; the dead
// letter itself is kept as always.
func TestDeadLetterStreamSettingActs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	target := newStream(t, pool, 1)
	pos := produce(t, pool, stream, 0, 3)
	require.NoError(t, streamconfig.NewStore(pool).Set(ctx, stream, &streamconfig.Config{
		DeadLetter: &streamconfig.DeadLetter{Enabled: true, MaxDeliveryAttempts: 1, Stream: target},
	}))
	group := testdb.Name("g")
	c, err := New(pool, testConfig(stream, group))
	require.NoError(t, err)
	runConsumer(t, c, func(_ context.Context, b *Batch) error {
		for _, e := range b.Events {
			if e.Offset == pos[1].Offset {
				return errors.New("poison")
			}
		}
		return nil
	})
	waitFor(t, 20*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })
	dl, err := NewAdmin(pool).DeadLetters(ctx, stream, group, "pending")
	require.NoError(t, err)
	require.Len(t, dl, 1)
	res, err := streams.FetchTx(ctx, pool, target, 0, 0, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, 1, "one copy in the dead-letter stream")
	h := res.Events[0].Headers
	require.Equal(t, stream, h["dlq_origin_stream"])
	require.Equal(t, "0", h["dlq_origin_partition"])
	require.Equal(t, fmt.Sprint(pos[1].Offset), h["dlq_origin_offset"])
	require.Equal(t, dl[0].EventID, h["dlq_origin_event_id"])
	require.Equal(t, group, h["dlq_group"])
	require.Equal(t, fmt.Sprint(dl[0].ID), h["dlq_dead_letter_id"])
	require.Contains(t, h["dlq_error"], "poison")
	require.JSONEq(t, "1", string(res.Events[0].Data), "the event's payload")
}
