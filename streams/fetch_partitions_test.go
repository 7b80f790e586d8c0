package streams_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestFetchPartitionsReadsAsFetch: one FetchPartitionsTx of several partitions gives
// each partition what FetchTx of it gives (events, bounds, watermarks, the
// out-of-range and missing-partition errors), in the order asked, with both the fast
// decoding and pgx's scan (the simple protocol); a head-only read gives the
// watermarks alone; a hole (a deleted row, as compaction leaves) is skipped as Fetch
// skips it; bad input fails the call.
func TestFetchPartitionsReadsAsFetch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 4)
	pool := testdb.Pool(t)
	for p := int32(0); p < 3; p++ {
		var recs []streams.Record
		for i := range 6 + int(p) {
			recs = append(recs, streams.Record{Key: fmt.Sprint("k", i%2), Bytes: []byte(fmt.Sprintf("p%d-%03d", p, i)),
				RawHeaders: []streams.Header{{Key: "h", Value: []byte{byte(i)}}}})
		}
		_, err := c.AppendPartition(ctx, s, p, recs, nil)
		require.NoError(t, err)
	}
	_, err := c.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(1), Data: json.RawMessage(`{"j":1}`),
		Headers: map[string]string{"a": "b"}})
	require.NoError(t, err)
	_, err = c.DeleteBefore(ctx, s, 2, 3)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DELETE FROM streamd.events WHERE stream_name = $1 AND partition = 0 AND "offset" = 2`, s)
	require.NoError(t, err)

	textCfg := testdb.Config(t)
	textCfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	textPool, err := pgxpool.NewWithConfig(ctx, textCfg)
	require.NoError(t, err)
	t.Cleanup(textPool.Close)

	reads := []streams.PartitionRead{
		{Partition: 1, Offset: 2, MaxRecords: 3},
		{Partition: 0, Offset: 0},
		{Partition: 0, Offset: 1, MaxBytes: 12},
		{Partition: 2, Offset: 1},      // below the log start (3)
		{Partition: 2, Offset: 3},      // at it
		{Partition: 2, Offset: 9},      // past the log end (8)
		{Partition: 3, Offset: 0},      // empty
		{Partition: 1, Offset: 7},      // the log end
		{Partition: 4, Offset: 0},      // no such partition
		{Partition: 2, HeadOnly: true}, // the head row alone
	}
	for _, db := range []streams.DBTX{pool, textPool} {
		got, err := streams.FetchPartitionsTx(ctx, db, s, reads)
		require.NoError(t, err)
		require.Len(t, got, len(reads))
		require.Equal(t, []int64{2, 3, 4}, offsets(got[0].Result.Events), "MaxRecords")
		require.Equal(t, []int64{0, 1, 3, 4, 5}, offsets(got[1].Result.Events), "the hole skipped")
		require.Equal(t, []int64{1}, offsets(got[2].Result.Events), "MaxBytes: the first event whatever its size")
		for i, r := range reads {
			g := got[i]
			require.Equal(t, r.Partition, g.Partition, "read %d", i)
			if r.HeadOnly {
				require.NoError(t, g.Err)
				require.Empty(t, g.Result.Events)
				require.Equal(t, [2]int64{3, 8}, [2]int64{g.Result.LogStartOffset, g.Result.HighWatermark})
				continue
			}
			want, wantErr := streams.FetchTx(ctx, pool, s, r.Partition, r.Offset, &streams.FetchOpts{MaxBytes: r.MaxBytes, MaxRecords: r.MaxRecords})
			if wantErr != nil {
				require.Error(t, g.Err, "read %d", i)
				require.Nil(t, g.Result)
				var wantOOR, gotOOR *streams.OffsetOutOfRangeError
				if errors.As(wantErr, &wantOOR) {
					require.ErrorAs(t, g.Err, &gotOOR, "read %d", i)
					require.Equal(t, *wantOOR, *gotOOR)
				} else {
					require.ErrorIs(t, g.Err, streams.ErrPartitionNotFound, "read %d", i)
				}
				continue
			}
			require.NoError(t, g.Err, "read %d", i)
			require.Len(t, g.Result.Events, len(want.Events), "read %d", i)
			for j := range want.Events {
				w, e := want.Events[j], g.Result.Events[j]
				require.True(t, w.Timestamp.Equal(e.Timestamp))
				w.Timestamp, e.Timestamp = time.Time{}, time.Time{}
				require.Equal(t, w, e, "read %d event %d", i, j)
			}
			want.Events, g.Result.Events = nil, nil
			require.Equal(t, *want, *g.Result, "read %d", i)
		}
	}

	// Bad input is its partition's error; the others are read.
	bad, err := streams.FetchPartitionsTx(ctx, pool, s, []streams.PartitionRead{{Partition: 0}, {Partition: -1}, {Partition: 1, Offset: -1}})
	require.NoError(t, err)
	require.NoError(t, bad[0].Err)
	require.NotEmpty(t, bad[0].Result.Events)
	require.ErrorIs(t, bad[1].Err, streams.ErrPartitionNotFound)
	require.ErrorIs(t, bad[2].Err, streams.ErrInvalidArgument)
	got, err := streams.FetchPartitionsTx(ctx, pool, testdb.Name("nosuch"), []streams.PartitionRead{{Partition: 0}})
	require.NoError(t, err)
	require.ErrorIs(t, got[0].Err, streams.ErrStreamNotFound)
}

func offsets(evs []streams.Event) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Offset
	}
	return out
}
