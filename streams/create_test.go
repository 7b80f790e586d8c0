package streams_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestAddStreamRefusesAndGrowStreamGrows: AddStream creates, and refuses an existing
// stream (with the same or another count) without changing it; GrowStream grows,
// refuses fewer partitions and an unknown stream.
func TestAddStreamRefusesAndGrowStreamGrows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := streams.NewClient(testdb.Pool(t), nil)
	name := testdb.Name("add")
	partitions := func() int {
		info, err := c.DescribeStream(ctx, name)
		require.NoError(t, err)
		return len(info.PartitionInfo)
	}

	require.ErrorIs(t, c.GrowStream(ctx, name, 2), streams.ErrStreamNotFound)
	require.NoError(t, c.AddStream(ctx, name, 2))
	require.Equal(t, 2, partitions())
	require.ErrorIs(t, c.AddStream(ctx, name, 3), streams.ErrStreamExists)
	require.ErrorIs(t, c.AddStream(ctx, name, 2), streams.ErrStreamExists)
	require.Equal(t, 2, partitions(), "a refused create changes nothing")

	require.NoError(t, c.GrowStream(ctx, name, 3))
	require.Equal(t, 3, partitions())
	require.ErrorIs(t, c.GrowStream(ctx, name, 1), streams.ErrPartitionsDecrease)
	require.ErrorIs(t, c.AddStream(ctx, "bad name", 1), streams.ErrInvalidName)
}

// TestSetMaxPayloadBytes: the limit is set and enforced on the next append; bad
// values and unknown streams are refused.
func TestSetMaxPayloadBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := streams.NewClient(testdb.Pool(t), nil)
	name := testdb.Name("limit")
	require.NoError(t, c.AddStream(ctx, name, 1))
	require.NoError(t, c.SetMaxPayloadBytes(ctx, name, 16))
	info, err := c.DescribeStream(ctx, name)
	require.NoError(t, err)
	require.EqualValues(t, 16, info.MaxPayloadBytes)
	_, err = c.Produce(ctx, streams.Record{Stream: name, Data: json.RawMessage(`{"this":"is longer than sixteen bytes"}`)})
	require.ErrorIs(t, err, streams.ErrPayloadTooLarge)
	require.ErrorIs(t, c.SetMaxPayloadBytes(ctx, name, 0), streams.ErrInvalidArgument)
	require.ErrorIs(t, c.SetMaxPayloadBytes(ctx, testdb.Name("missing"), 10), streams.ErrStreamNotFound)
}

// TestAlterStreamIsAllOrNothing: AlterStream grows and sets the payload limit
// together; a refused grow (fewer partitions, an unknown stream) or limit leaves both
// as they were.
func TestAlterStreamIsAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := streams.NewClient(testdb.Pool(t), nil)
	name := testdb.Name("alter")
	require.NoError(t, c.AddStream(ctx, name, 2))
	p, n := int32(3), int32(1000)
	require.NoError(t, c.AlterStream(ctx, name, &streams.AlterStreamOpts{Partitions: &p, MaxPayloadBytes: &n}))
	fewer, more, zero, other := int32(1), int32(4), int32(0), int32(2000)
	for _, tc := range []struct {
		opts *streams.AlterStreamOpts
		want error
	}{
		{&streams.AlterStreamOpts{Partitions: &fewer, MaxPayloadBytes: &other}, streams.ErrPartitionsDecrease},
		{&streams.AlterStreamOpts{Partitions: &more, MaxPayloadBytes: &zero}, streams.ErrInvalidArgument},
		{&streams.AlterStreamOpts{}, streams.ErrInvalidArgument},
		{nil, streams.ErrInvalidArgument},
	} {
		require.ErrorIs(t, c.AlterStream(ctx, name, tc.opts), tc.want)
		info, err := c.DescribeStream(ctx, name)
		require.NoError(t, err)
		require.Len(t, info.PartitionInfo, 3, "a refused alter changes nothing")
		require.EqualValues(t, 1000, info.MaxPayloadBytes, "a refused alter changes nothing")
	}
	require.ErrorIs(t, c.AlterStream(ctx, testdb.Name("missing"), &streams.AlterStreamOpts{Partitions: &more}), streams.ErrStreamNotFound)
}

// TestStreamCreatedAtTx: a stream's creation time, as DescribeStream has it, changes
// when the stream is deleted and created again; an unknown stream is
// ErrStreamNotFound.
func TestStreamCreatedAtTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := streams.NewClient(pool, nil)
	name := testdb.Name("createdat")
	_, err := streams.StreamCreatedAtTx(ctx, pool, name)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
	require.NoError(t, c.AddStream(ctx, name, 3))
	at, err := streams.StreamCreatedAtTx(ctx, pool, name)
	require.NoError(t, err)
	info, err := c.DescribeStream(ctx, name)
	require.NoError(t, err)
	require.True(t, at.Equal(info.CreatedAt), "%v, DescribeStream: %v", at, info.CreatedAt)
	require.NoError(t, c.DeleteStream(ctx, name))
	require.NoError(t, c.AddStream(ctx, name, 3))
	again, err := streams.StreamCreatedAtTx(ctx, pool, name)
	require.NoError(t, err)
	require.False(t, again.Equal(at), "created again: another identity")
}
