package messages_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// TestSoakTableStaysBounded churns a queue (send, receive, ack, some nacks) for
// $STREAMD_SOAK_DURATION (default 3m) and samples streamd.queue_messages' live and dead
// tuples and its table, index and total sizes (logged as they come, and at the end
// again as a Markdown table to paste into bench/RESULTS.md): with the table's
// autovacuum settings (0086_queue_storage.sql) both must
// level off instead of growing with the number of messages processed. It runs only
// with STREAMD_SOAK=1 (make soak-queue), alone, since it measures the whole table.
func TestSoakTableStaysBounded(t *testing.T) {
	if os.Getenv("STREAMD_SOAK") != "1" {
		t.Skip("soak: set STREAMD_SOAK=1 (make soak-queue)")
	}
	dur := 3 * time.Minute
	if v := os.Getenv("STREAMD_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err)
		dur = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), dur+time.Minute)
	defer cancel()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{VisibilityTimeout: 5 * time.Second, MaxDeliveryAttempts: 1000})

	wctx, stop := context.WithTimeout(ctx, dur)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // producer: keeps a backlog of a few thousand
		defer wg.Done()
		batch := make([]messages.OutgoingMessage, 100)
		for i := range batch {
			batch[i] = messages.OutgoingMessage{Data: json.RawMessage(`{"payload":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)}
		}
		for wctx.Err() == nil {
			if count(t, pool, q) > 5000 {
				time.Sleep(10 * time.Millisecond) // throttle: the consumers are behind
				continue
			}
			if _, err := c.Send(wctx, q, batch...); err != nil && wctx.Err() == nil {
				require.NoError(t, err)
			}
		}
	}()
	var processed int64
	var pmu sync.Mutex
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for wctx.Err() == nil {
				msgs, err := c.Receive(wctx, q, &messages.ReceiveOpts{Max: 50, Wait: time.Second})
				if wctx.Err() != nil {
					return
				}
				require.NoError(t, err)
				var ack, nack []messages.Receipt
				for _, m := range msgs {
					if m.Offset%20 == 0 && m.DeliveryAttempts == 1 {
						nack = append(nack, m.Receipt)
					} else {
						ack = append(ack, m.Receipt)
					}
				}
				require.NoError(t, c.Ack(context.WithoutCancel(wctx), ack...))
				require.NoError(t, c.Nack(context.WithoutCancel(wctx), nil, nack...))
				pmu.Lock()
				processed += int64(len(ack))
				pmu.Unlock()
			}
		}()
	}

	type sample struct {
		at        time.Duration
		processed int64
		dead, liv int64
		size      int64 // table and indexes
		table     int64 // heap and TOAST
		index     int64
		vacuums   int64
	}
	var samples []sample
	start := time.Now()
	tick := time.NewTicker(dur / 24)
	defer tick.Stop()
	for wctx.Err() == nil {
		select {
		case <-wctx.Done():
		case <-tick.C:
			var s sample
			require.NoError(t, pool.QueryRow(ctx, `SELECT n_dead_tup, n_live_tup, pg_total_relation_size(relid),
				pg_table_size(relid), pg_indexes_size(relid), autovacuum_count
				FROM pg_stat_user_tables WHERE schemaname = 'streamd' AND relname = 'queue_messages'`).Scan(&s.dead, &s.liv, &s.size, &s.table, &s.index, &s.vacuums))
			s.at = time.Since(start).Round(time.Second)
			pmu.Lock()
			s.processed = processed
			pmu.Unlock()
			samples = append(samples, s)
			t.Logf("t=%v processed=%d live=%d dead=%d table=%dKiB indexes=%dKiB total=%dKiB autovacuums=%d",
				s.at, s.processed, s.liv, s.dead, s.table/1024, s.index/1024, s.size/1024, s.vacuums)
		}
	}
	wg.Wait()
	// The samples again as a Markdown table, to paste into bench/RESULTS.md.
	table := "\n| t | processed | live | dead | table MiB | indexes MiB | total MiB | autovacuums |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n"
	for _, s := range samples {
		table += fmt.Sprintf("| %v | %d | %d | %d | %.1f | %.1f | %.1f | %d |\n", s.at, s.processed, s.liv, s.dead,
			float64(s.table)/(1<<20), float64(s.index)/(1<<20), float64(s.size)/(1<<20), s.vacuums)
	}
	t.Log(table)
	require.GreaterOrEqual(t, len(samples), 8)
	half := samples[len(samples)/2]
	last := samples[len(samples)-1]
	var maxDeadFirst int64
	for _, s := range samples[:len(samples)/2] {
		maxDeadFirst = max(maxDeadFirst, s.dead)
	}
	require.Greater(t, last.vacuums, samples[0].vacuums, "autovacuum must have run on the queue table")
	require.LessOrEqual(t, last.size, half.size*3/2+(1<<20), "table size kept growing: %d KiB at half time, %d KiB at the end", half.size/1024, last.size/1024)
	require.LessOrEqual(t, last.dead, 2*maxDeadFirst+20000, "dead tuples kept growing")
}
