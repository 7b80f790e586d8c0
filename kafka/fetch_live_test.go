package kafka

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// TestConsumerSeesConcurrentAppendsGapless (L1 through the Kafka fetch): writers
// append to four partitions at once (Produce calls, some sharing transactions, and
// plain SQL INSERTs) while a franz-go consumer reads them with small fetch bounds, so
// that fetches take the first pass's one statement, woken passes, reads of their own
// for a backlog, byte shares and the stash. Each partition's records arrive exactly
// once, in offset order, from 0 with no gap, and carry what was appended there.
func TestConsumerSeesConcurrentAppendsGapless(t *testing.T) {
	t.Parallel()
	const partitions, writers, perWriter = 4, 6, 60
	l := newLiveScene(t, "live", partitions)
	pool, hub, ctx, topic, sc, cl := l.pool, l.hub, l.ctx, l.topic, l.sc, l.cl

	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				p := int32((w + i) % partitions)
				val := fmt.Sprintf("w%d-%03d-%s", w, i, string(make([]byte, 100)))
				if err := writeLive(ctx, pool, sc, hub, topic, w, p, val); err != nil {
					errs <- err
					return
				}
			}
		}()
	}

	var got atomic.Int64
	next := consumeGapless(t, ctx, cl, writers*perWriter, &got, errs, 60*time.Second)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	l.requireReadToTheEnd(t, next)
}

// liveScene is the live tests' setting: a Server woken by a hub of its own, a new
// topic, a streams client whose small calls share transactions, and a franz-go
// consumer of every partition from offset 0 with small fetch bounds (so that fetches
// take byte shares, backlogs and reads left running, or the tail readers).
type liveScene struct {
	pool    *pgxpool.Pool
	hub     *wakeup.Hub
	ts      *testServer
	ctx     context.Context
	topic   string
	sc      *streams.Client
	offsets map[int32]kgo.Offset // every partition at 0
	cl      *kgo.Client
}

func newLiveScene(t *testing.T, prefix string, partitions int32) *liveScene {
	t.Helper()
	l := &liveScene{pool: testdb.Pool(t), hub: wakeup.NewHub(), ctx: testCtx(t), topic: testdb.Name(prefix)}
	l.ts = startServer(t, l.pool, &Config{Wakeups: l.hub})
	l.sc = streams.NewClient(l.pool, &streams.ClientConfig{MaxAppendsInFlight: 2})
	require.NoError(t, l.sc.CreateStream(l.ctx, l.topic, partitions))
	l.offsets = map[int32]kgo.Offset{}
	for p := range partitions {
		l.offsets[p] = kgo.NewOffset().At(0)
	}
	l.cl = newClient(t, []string{l.ts.addr}, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{l.topic: l.offsets}),
		kgo.FetchMaxBytes(2<<10), kgo.FetchMaxPartitionBytes(1<<10), kgo.FetchMaxWait(200*time.Millisecond))
	return l
}

// requireReadToTheEnd checks that next (consumeGapless's) is every partition's log end.
func (l *liveScene) requireReadToTheEnd(t *testing.T, next map[int32]int64) {
	t.Helper()
	heads, err := l.sc.PartitionHeads(l.ctx, l.topic)
	require.NoError(t, err)
	for _, h := range heads {
		require.Equal(t, h.NextOffset, next[h.Partition], "partition %d read to its end", h.Partition)
	}
}

// writeLive writes val to topic's partition p as writer w of the live tests: writer 0
// by a plain SQL INSERT (the offset trigger's path), the others by Produce (calls that
// may share transactions), then announces it as the tailer does after the commit.
func writeLive(ctx context.Context, pool *pgxpool.Pool, sc *streams.Client, hub *wakeup.Hub, topic string, w int, p int32, val string) error {
	var err error
	if w == 0 {
		_, err = pool.Exec(ctx, `INSERT INTO streamd.events (stream_name, partition, data_bytes) VALUES ($1, $2, $3)`,
			topic, p, []byte(val))
	} else {
		_, err = sc.Produce(ctx, streams.Record{Stream: topic, Partition: streams.PartitionOf(p), Bytes: []byte(val)})
	}
	if err != nil {
		return err
	}
	hub.NotifyPartitions(topic, p)
	return nil
}

// consumeGapless polls cl until got reaches total: each partition's records must come
// once, in offset order from 0 with no gap, each a value of writeLive's writers. It
// fails the test on an error from errs, a fetch error, or after within. It returns
// each partition's next offset.
func consumeGapless(t *testing.T, ctx context.Context, cl *kgo.Client, total int, got *atomic.Int64, errs <-chan error, within time.Duration) map[int32]int64 {
	t.Helper()
	next := map[int32]int64{}
	deadline := time.Now().Add(within)
	for got.Load() < int64(total) {
		require.True(t, time.Now().Before(deadline), "%d of %d records within %s", got.Load(), total, within)
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		fs.EachError(func(tp string, p int32, err error) {
			if err != context.DeadlineExceeded {
				t.Fatalf("fetch %s/%d: %v", tp, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			require.Equal(t, next[r.Partition], r.Offset, "partition %d: offset %d after %d", r.Partition, r.Offset, next[r.Partition]-1)
			require.Contains(t, string(r.Value), "-", "partition %d offset %d: a value of the writers", r.Partition, r.Offset)
			next[r.Partition]++
			got.Add(1)
		})
	}
	return next
}
