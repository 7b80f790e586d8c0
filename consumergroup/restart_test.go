package consumergroup

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/tailer/tailertest"
	"github.com/streamd/streamd/streams"
)

// TestSurvivesPostgresRestart (E2): PostgreSQL crashes (immediate shutdown) and
// restarts while a producer appends and a consumer group consumes. Both reconnect with
// backoff and go on; every record acknowledged to the producer is handled, and the
// group's lag reaches zero. On a private cluster, so other tests are not disturbed.
func TestSurvivesPostgresRestart(t *testing.T) {
	t.Parallel()
	ctx, cancelAll := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelAll()
	cluster, url := tailertest.Cluster(t, nil)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	s := "restart"
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, s, 2))

	var h handled
	cfg := testConfig(s, "g")
	cfg.SessionTimeout = 5 * time.Second
	c, err := New(pool, cfg)
	require.NoError(t, err)
	stop := runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		for _, e := range b.Events {
			h.add(e.Partition, e.Offset)
		}
		return nil
	})

	prod, err := streams.NewProducer(pool, &streams.ProducerConfig{Logger: quietLogger(), RetryTimeout: time.Minute})
	require.NoError(t, err)
	defer prod.Close(context.Background())
	var (
		mu    sync.Mutex
		acked []streams.Position
	)
	produced := make(chan error, 1)
	go func() {
		for i := 0; i < 400; i++ {
			pos, err := prod.Produce(ctx, streams.Record{Stream: s, Key: fmt.Sprint("k", i), EventID: fmt.Sprint("e", i),
				Data: json.RawMessage(fmt.Sprint(i))})
			if err != nil {
				produced <- err
				return
			}
			mu.Lock()
			acked = append(acked, pos)
			mu.Unlock()
		}
		produced <- nil
	}()
	waitFor(t, 30*time.Second, "some records before the crash", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= 100
	})
	require.NoError(t, cluster.Restart(ctx, true))
	require.NoError(t, <-produced)

	waitFor(t, 60*time.Second, "the group to catch up after the restart", func() bool {
		var lag int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(sum(lag), -1) FROM streamd.consumer_group_status
			WHERE stream_name = $1 AND group_id = 'g'`, s).Scan(&lag); err != nil {
			return false
		}
		return lag == 0
	})
	mu.Lock()
	h.requireAll(t, acked)
	require.Len(t, acked, 400)
	mu.Unlock()
	var stored int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.events WHERE stream_name = $1", s).Scan(&stored))
	require.Equal(t, 400, stored, "every record stored once")
	require.NoError(t, stop())
}
