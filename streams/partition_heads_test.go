package streams_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// PartitionHeads reads every partition's log start and end in one read, and knows
// nothing of a stream that does not exist.
func TestPartitionHeads(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	c := streams.NewClient(pool, nil)
	name := testdb.Name("heads")
	require.NoError(t, c.CreateStream(ctx, name, 3))
	_, err := c.AppendPartition(ctx, name, 1, []streams.Record{{Bytes: []byte("a")}, {Bytes: []byte("b")}}, nil)
	require.NoError(t, err)
	_, err = c.DeleteBefore(ctx, name, 1, 1)
	require.NoError(t, err)

	heads, err := c.PartitionHeads(ctx, name)
	require.NoError(t, err)
	require.Len(t, heads, 3)
	for p, h := range heads {
		require.Equal(t, int32(p), h.Partition)
	}
	require.Equal(t, [][2]int64{{0, 0}, {1, 2}, {0, 0}},
		[][2]int64{{heads[0].LogStartOffset, heads[0].NextOffset}, {heads[1].LogStartOffset, heads[1].NextOffset}, {heads[2].LogStartOffset, heads[2].NextOffset}})
	require.NotNil(t, heads[1].LastAppendedAt)

	heads, err = c.PartitionHeads(ctx, testdb.Name("nosuch"))
	require.NoError(t, err)
	require.Empty(t, heads)
}
