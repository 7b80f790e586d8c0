package streams_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// FetchPartitionsTx on a transaction (its doc allows one): every missing partition
// is its own ErrPartitionNotFound / ErrStreamNotFound (the second was the aborted
// transaction's 25P02), and a negative offset fails only its partition.
func TestFetchPartitionsTxMissingPartitionsInATransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	got, err := streams.FetchPartitionsTx(ctx, tx, testdb.Name("nosuch"), []streams.PartitionRead{{Partition: 0}, {Partition: 1}})
	require.NoError(t, err)
	require.ErrorIs(t, got[0].Err, streams.ErrStreamNotFound)
	require.ErrorIs(t, got[1].Err, streams.ErrStreamNotFound, "second: %v", got[1].Err)

	c := streams.NewClient(pool, nil)
	s := testdb.Name("fpmiss")
	require.NoError(t, c.CreateStream(ctx, s, 1))
	_, err = c.AppendPartition(ctx, s, 0, []streams.Record{{Bytes: []byte("a")}}, nil)
	require.NoError(t, err)
	tx2, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx2.Rollback(ctx)
	got, err = streams.FetchPartitionsTx(ctx, tx2, s, []streams.PartitionRead{{Partition: 3}, {Partition: 0, Offset: -1},
		{Partition: 5}, {Partition: 0}})
	require.NoError(t, err)
	require.ErrorIs(t, got[0].Err, streams.ErrPartitionNotFound)
	require.ErrorIs(t, got[1].Err, streams.ErrInvalidArgument)
	require.ErrorIs(t, got[2].Err, streams.ErrPartitionNotFound, "second: %v", got[2].Err)
	require.NoError(t, got[3].Err)
	require.Len(t, got[3].Result.Events, 1)
}

// Under concurrent appends, each partition's events of one FetchPartitionsTx are
// exactly [0, high watermark): gapless, in order, none past it, none missing.
func TestFetchPartitionsSnapshotUnderAppends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := streams.NewClient(pool, nil)
	s := testdb.Name("fpsnap")
	require.NoError(t, c.CreateStream(ctx, s, 3))
	done := make(chan error, 1)
	go func() {
		for i := 0; i < 300; i++ {
			recs := make([]streams.Record, 1+i%5)
			for j := range recs {
				recs[j] = streams.Record{Bytes: []byte("x")}
			}
			if _, err := c.AppendPartition(ctx, s, int32(i%3), recs, nil); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	reads := []streams.PartitionRead{{Partition: 0, MaxRecords: 1 << 20, MaxBytes: 1 << 30},
		{Partition: 1, MaxRecords: 1 << 20, MaxBytes: 1 << 30}, {Partition: 2, MaxRecords: 1 << 20, MaxBytes: 1 << 30}}
	for n := 0; ; n++ {
		select {
		case err := <-done:
			require.NoError(t, err)
			t.Logf("%d reads", n)
			return
		default:
		}
		got, err := streams.FetchPartitionsTx(ctx, pool, s, reads)
		require.NoError(t, err)
		for _, g := range got {
			require.NoError(t, g.Err)
			require.Len(t, g.Result.Events, int(g.Result.HighWatermark), "partition %d", g.Partition)
			for i, e := range g.Result.Events {
				require.Equal(t, int64(i), e.Offset)
			}
		}
	}
}
