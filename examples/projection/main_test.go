package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/projection"
	"github.com/streamd/streamd/streams"
)

// TestProjectionExactlyOnce: the projection applies every deposit once; after the
// group's offsets are reset to the start and it runs again, the balances are
// unchanged (a replay applies nothing twice).
func TestProjectionExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream, group := testdb.Name("deposits"), testdb.Name("balances")
	client := streams.NewClient(pool, nil)
	require.NoError(t, client.CreateStream(ctx, stream, 3))
	var recs []streams.Record
	want := map[string]int64{}
	for i := 0; i < 60; i++ {
		acct := fmt.Sprint("acct-", i%7)
		recs = append(recs, streams.Record{Stream: stream, Key: acct, Data: []byte(fmt.Sprintf(`{"amount": %d}`, i))})
		want[acct] += int64(i)
	}
	_, err := client.Produce(ctx, recs...)
	require.NoError(t, err)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	run := func() {
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- Project(rctx, pool, stream, group, logger) }()
		deadline := time.Now().Add(15 * time.Second)
		for {
			var lag int64
			require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(lag), -1) FROM streamd.consumer_group_status
				WHERE stream_name = $1 AND group_id = $2`, stream, group).Scan(&lag))
			if lag == 0 {
				break
			}
			require.True(t, time.Now().Before(deadline), "projection did not catch up")
			time.Sleep(20 * time.Millisecond) // polling interval
		}
		cancel()
		require.NoError(t, <-done)
	}
	check := func() {
		states, err := projection.NewStore(pool).List(ctx, ProjectionType(stream))
		require.NoError(t, err)
		got := map[string]int64{}
		for _, s := range states {
			var b Balance
			require.NoError(t, json.Unmarshal(s.State, &b))
			got[s.AggregateID] = b.Balance
		}
		require.Equal(t, want, got)
	}
	run()
	check()
	_, err = consumergroup.NewAdmin(pool).ResetOffsets(ctx, stream, group, consumergroup.ResetOpts{Mode: consumergroup.ResetToEarliest})
	require.NoError(t, err)
	run()
	check()
}
