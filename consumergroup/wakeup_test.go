package consumergroup_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// TestConsumerWithWakeups: a consumer given a wake-up hub receives events appended
// while it idles; its partition workers subscribe and unsubscribe cleanly.
func TestConsumerWithWakeups(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	s := testdb.Name("wake")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, s, 2))
	hub := wakeup.NewHub()
	c, err := consumergroup.New(pool, &consumergroup.Config{Stream: s, Group: "g", SessionTimeout: 5 * time.Second,
		FetchMaxWait: 10 * time.Second, Wakeups: hub})
	require.NoError(t, err)
	got := make(chan streams.Event, 10)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Run(runCtx, func(ctx context.Context, b *consumergroup.Batch) error {
			for _, e := range b.Events {
				got <- e
			}
			return nil
		})
	}()
	require.Eventually(t, func() bool { return len(c.Assignment()) == 2 }, 20*time.Second, 10*time.Millisecond)
	for p := int32(0); p < 2; p++ {
		pos, err := sc.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(p), Data: json.RawMessage(`{}`)})
		require.NoError(t, err)
		hub.NotifyPartitions(s, pos[0].Partition)
	}
	for i := 0; i < 2; i++ {
		select {
		case <-got:
		case <-ctx.Done():
			t.Fatal("events not delivered")
		}
	}
	stop()
	require.NoError(t, <-done)
}
