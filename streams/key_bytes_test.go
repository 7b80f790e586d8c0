package streams_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/streams"
)

// KeyBytes (keys that are not text) are appended by AppendPartition only, never with
// a Key as well, and come back exactly from Fetch; an empty one is a key, not none.
func TestAppendPartitionKeyBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	_, err := c.AppendPartition(ctx, s, 0, []streams.Record{{Bytes: []byte("a")}, {Key: "k", KeyBytes: []byte{1}}}, nil)
	require.ErrorIs(t, err, streams.ErrInvalidArgument, "Key and KeyBytes")
	_, err = c.Produce(ctx, streams.Record{Stream: s, KeyBytes: []byte{0xff}})
	require.ErrorIs(t, err, streams.ErrInvalidArgument, "Produce refuses KeyBytes")

	_, err = c.AppendPartition(ctx, s, 0, []streams.Record{{KeyBytes: []byte{0, 0xff}}, {KeyBytes: []byte{}}, {}}, nil)
	require.NoError(t, err)
	res, err := c.Fetch(ctx, s, 0, 0, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, 3, "the refused batch wrote nothing")
	require.Equal(t, []byte{0, 0xff}, res.Events[0].KeyBytes)
	require.NotNil(t, res.Events[1].KeyBytes)
	require.Empty(t, res.Events[1].KeyBytes)
	require.Nil(t, res.Events[2].KeyBytes)
	require.Equal(t, 2, res.Events[0].Size())
}
