package retention_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/streamd/streamd/streams"
)

// Retention running in a loop while producers append and readers consume: the reader
// of a protected group never finds a record gone before it committed past it and sees
// every acknowledged record exactly once, in order; an unprotected reader never sees a
// hole above the log start; afterwards every partition holds exactly the offsets from
// its log start to its log end, and exactly the policy's count once the group caught up.
func TestRetentionUnderLoadLosesNothingAboveTheLine(t *testing.T) {
	t.Parallel()
	const (
		partitions = 3
		keep       = 40
		runFor     = 1500 * time.Millisecond
	)
	f := setup(t, partitions)
	for p := int32(0); p < partitions; p++ {
		f.group("protected", p, 0, time.Now())
	}
	f.policy("max_event_count = $2, protect_consumers = true", keep)

	ctx, cancel := context.WithTimeout(f.ctx, 60*time.Second)
	defer cancel()
	stopProducing := make(chan struct{})
	var passes atomic.Int64 // completed retention passes
	var (
		mu    sync.Mutex
		acked = map[int32]map[int64]string{} // partition -> offset -> event id
	)
	for p := int32(0); p < partitions; p++ {
		acked[p] = map[int64]string{}
	}
	producers, pctx := errgroup.WithContext(ctx)
	for w := 0; w < 2; w++ {
		rng := rand.New(rand.NewSource(int64(w + 1)))
		producers.Go(func() error {
			for i := 0; ; i++ {
				select {
				case <-stopProducing:
					return nil
				default:
				}
				n := 1 + rng.Intn(8)
				recs := make([]streams.Record, n)
				for j := range recs {
					recs[j] = streams.Record{Stream: f.stream, Partition: streams.PartitionOf(int32(rng.Intn(partitions))),
						EventID: fmt.Sprintf("w%d-%d-%d", w, i, j), Data: json.RawMessage(`{}`)}
				}
				pos, err := f.client.Produce(pctx, recs...)
				if err != nil {
					return err
				}
				mu.Lock()
				for j, p := range pos {
					acked[p.Partition][p.Offset] = recs[j].EventID
				}
				mu.Unlock()
			}
		})
	}

	readers, rctx := errgroup.WithContext(ctx)
	seen := make([][]streams.Event, partitions)
	producersDone := make(chan struct{})
	for p := int32(0); p < partitions; p++ {
		readers.Go(func() error { // the protected group's member for partition p
			// Start late: only once retention has run after the partition grew well past
			// the policy's count, so that without the protection offset 0 would be gone.
			var startPass int64 = -1
			for {
				mu.Lock()
				grown := len(acked[p]) >= 3*keep
				mu.Unlock()
				if grown && startPass < 0 {
					startPass = passes.Load()
				}
				if startPass >= 0 && passes.Load() >= startPass+2 {
					break
				}
				if rctx.Err() != nil {
					return rctx.Err()
				}
				time.Sleep(time.Millisecond) // polling a condition; the deadline is ctx's
			}
			next := int64(0)
			for {
				finished := closed(producersDone) // before the fetch: its high watermark is then final
				res, err := f.client.Fetch(rctx, f.stream, p, next, &streams.FetchOpts{MaxRecords: 13})
				if err != nil {
					return fmt.Errorf("protected reader %d at %d: %w", p, next, err)
				}
				for _, e := range res.Events {
					if e.Offset != next {
						return fmt.Errorf("protected reader %d: hole: wanted %d, got %d", p, next, e.Offset)
					}
					seen[p] = append(seen[p], e)
					next++
				}
				if _, err := f.pool.Exec(rctx, `UPDATE streamd.consumer_offsets SET "offset" = $4, updated_at = now()
					WHERE stream_name = $1 AND group_id = $2 AND partition = $3`, f.stream, "protected", p, next); err != nil {
					return err
				}
				if finished && len(res.Events) == 0 && next == res.HighWatermark {
					return nil
				}
			}
		})
		readers.Go(func() error { // a reader outside any group: skips to the log start when overtaken
			next := int64(0)
			for {
				finished := closed(producersDone)
				res, err := f.client.Fetch(rctx, f.stream, p, next, &streams.FetchOpts{MaxRecords: 5})
				var oor *streams.OffsetOutOfRangeError
				if errors.As(err, &oor) && next < oor.LogStartOffset {
					next = oor.LogStartOffset
					continue
				}
				if err != nil {
					return fmt.Errorf("free reader %d at %d: %w", p, next, err)
				}
				for _, e := range res.Events {
					if e.Offset != next {
						return fmt.Errorf("free reader %d: hole above the log start: wanted %d, got %d", p, next, e.Offset)
					}
					next++
				}
				if finished && len(res.Events) == 0 && next == res.HighWatermark {
					return nil
				}
			}
		})
	}

	cleaner, cctx := errgroup.WithContext(ctx)
	stopCleaning := make(chan struct{})
	cleaner.Go(func() error {
		for {
			select {
			case <-stopCleaning:
				return nil
			default:
			}
			if _, err := f.runner.Apply(cctx, f.stream, nil); err != nil {
				return err
			}
			passes.Add(1)
		}
	})

	timer := time.NewTimer(runFor)
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
	// Produce on until every partition grew past what its protected reader waits for
	// (3 × keep): on a slow machine runFor alone left a partition short, and its reader
	// waited for growth that never came until the test's deadline.
	grownAll := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for p := int32(0); p < partitions; p++ {
			if len(acked[p]) < 3*keep {
				return false
			}
		}
		return true
	}
	for !grownAll() && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond) // polling a condition; the deadline is ctx's
	}
	close(stopProducing)
	require.NoError(t, producers.Wait())
	close(producersDone)
	require.NoError(t, readers.Wait())
	close(stopCleaning)
	require.NoError(t, cleaner.Wait())
	require.Greater(t, passes.Load(), int64(1))

	// Every acknowledged record was read once, in order, by the protected group.
	for p := int32(0); p < partitions; p++ {
		require.Equal(t, len(acked[p]), len(seen[p]), "partition %d: records read", p)
		for i, e := range seen[p] {
			require.Equal(t, int64(i), e.Offset)
			require.Equal(t, acked[p][e.Offset], e.EventID, "partition %d offset %d", p, e.Offset)
		}
	}
	// The group caught up: a final pass keeps exactly `keep`, with no hole.
	_, err := f.runner.Apply(f.ctx, f.stream, nil)
	require.NoError(t, err)
	deletedSome := false
	for p := int32(0); p < partitions; p++ {
		start, end := f.head(p)
		require.Equal(t, seq(start, end), f.stored(p), "partition %d: offsets from the log start to the end, no hole", p)
		require.Equal(t, int64(len(acked[p])), end)
		if end >= keep {
			require.Equal(t, end-keep, start, "partition %d keeps exactly %d", p, keep)
			deletedSome = true
		}
	}
	require.True(t, deletedSome, "the test produced too little to exercise retention")
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
