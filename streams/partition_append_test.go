package streams_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/streams"
)

// AppendPartition keeps raw headers exactly (order, repeated keys, byte and null
// values), and a bad record anywhere in a batch writes nothing of it.
func TestAppendPartitionRawHeadersAndAtomicity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 2)
	hdrs := []streams.Header{{Key: "b", Value: []byte{0, 0xff, 1}}, {Key: "a", Value: nil}, {Key: "b", Value: []byte("x")}, {Key: "e", Value: []byte{}}}
	pos, err := c.AppendPartition(ctx, s, 1, []streams.Record{
		{Key: "k", Bytes: []byte{9, 8, 7}, RawHeaders: hdrs},
		{Data: json.RawMessage(`{"v":1}`)},
		{}, // tombstone
	}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(0), pos.BaseOffset)
	require.False(t, pos.Duplicate)

	res, err := c.Fetch(ctx, s, 1, 0, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, 3)
	require.Equal(t, hdrs[0], res.Events[0].RawHeaders[0])
	require.Nil(t, res.Events[0].RawHeaders[1].Value, "a null header value stays null")
	require.NotNil(t, res.Events[0].RawHeaders[3].Value, "an empty header value stays empty, not null")
	require.Len(t, res.Events[0].RawHeaders, 4)
	require.Equal(t, []byte{9, 8, 7}, res.Events[0].Bytes)
	require.Equal(t, "k", res.Events[0].Key)
	require.JSONEq(t, `{"v":1}`, string(res.Events[1].Data))
	require.Nil(t, res.Events[2].Data)
	require.Nil(t, res.Events[2].Bytes)
	require.Equal(t, res.Events[0].Timestamp, res.Events[2].Timestamp, "one batch, one log time")

	bad := []struct {
		name string
		recs []streams.Record
		want error
	}{
		{"invalid JSON", []streams.Record{{Bytes: []byte("ok")}, {Data: json.RawMessage(`{`)}}, streams.ErrInvalidJSON},
		{"NUL in a header key", []streams.Record{{RawHeaders: []streams.Header{{Key: "a\x00b"}}}}, streams.ErrInvalidArgument},
		{"payload too large", []streams.Record{{Bytes: []byte("ok")}, {Bytes: make([]byte, 2<<20)}}, streams.ErrPayloadTooLarge},
		{"another partition", []streams.Record{{Partition: streams.PartitionOf(0)}}, streams.ErrInvalidArgument},
	}
	for _, b := range bad {
		_, err := c.AppendPartition(ctx, s, 1, b.recs, nil)
		require.ErrorIs(t, err, b.want, b.name)
	}
	_, err = c.AppendPartition(ctx, s, 2, []streams.Record{{}}, nil)
	require.ErrorIs(t, err, streams.ErrPartitionNotFound)
	info, err := c.DescribeStream(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(3), info.PartitionInfo[1].NextOffset, "the bad batches wrote nothing")

	_, err = c.Produce(ctx, streams.Record{Stream: s, RawHeaders: hdrs})
	require.ErrorIs(t, err, streams.ErrInvalidArgument, "Produce refuses what it cannot store")
}

// An idempotent producer's batches are appended in sequence order, once each: a
// retry of a recent batch returns its original offset and stores nothing; a gap is
// refused; an older epoch is fenced.
func TestAppendPartitionProducerSequences(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	id, epoch, err := c.InitProducer(ctx, -1, -1)
	require.NoError(t, err)
	require.Equal(t, int16(0), epoch)
	batch := func(n int) []streams.Record { return make([]streams.Record, n) }
	seq := func(first int32, e int16) *streams.AppendPartitionOpts {
		return &streams.AppendPartitionOpts{Producer: &streams.ProducerSequence{ProducerID: id, Epoch: e, FirstSequence: first}}
	}
	_, err = c.AppendPartition(ctx, s, 0, batch(1), seq(3, 0))
	require.ErrorIs(t, err, streams.ErrOutOfOrderSequence, "a new producer starts at 0")

	p0, err := c.AppendPartition(ctx, s, 0, batch(2), seq(0, 0))
	require.NoError(t, err)
	p1, err := c.AppendPartition(ctx, s, 0, batch(3), seq(2, 0))
	require.NoError(t, err)
	require.Equal(t, int64(2), p1.BaseOffset)
	again, err := c.AppendPartition(ctx, s, 0, batch(2), seq(0, 0))
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, p0.BaseOffset, again.BaseOffset)
	require.True(t, p0.Timestamp.Equal(again.Timestamp))
	_, err = c.AppendPartition(ctx, s, 0, batch(1), seq(6, 0))
	require.ErrorIs(t, err, streams.ErrOutOfOrderSequence, "sequence 5 was skipped")

	// A bumped epoch starts again at 0; the old epoch is fenced.
	_, e1, err := c.InitProducer(ctx, id, 0)
	require.NoError(t, err)
	require.Equal(t, int16(1), e1)
	_, _, err = c.InitProducer(ctx, id, 0)
	require.ErrorIs(t, err, streams.ErrProducerFenced)
	_, err = c.AppendPartition(ctx, s, 0, batch(1), seq(0, 1))
	require.NoError(t, err)
	_, err = c.AppendPartition(ctx, s, 0, batch(1), seq(5, 0))
	require.ErrorIs(t, err, streams.ErrProducerFenced)

	info, err := c.DescribeStream(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(6), info.PartitionInfo[0].NextOffset)
}

func TestDeleteBeforeMovesTheLogStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	_, err := c.AppendPartition(ctx, s, 0, make([]streams.Record, 10), nil)
	require.NoError(t, err)
	ls, err := c.DeleteBefore(ctx, s, 0, 4)
	require.NoError(t, err)
	require.Equal(t, int64(4), ls)
	_, err = c.Fetch(ctx, s, 0, 3, nil)
	require.ErrorIs(t, err, streams.ErrOffsetOutOfRange)
	res, err := c.Fetch(ctx, s, 0, 4, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, 6)
	_, err = c.DeleteBefore(ctx, s, 0, 11)
	require.ErrorIs(t, err, streams.ErrOffsetOutOfRange)
	_, err = c.DeleteBefore(ctx, s, 0, -5) // Kafka: OFFSET_OUT_OF_RANGE too
	require.ErrorIs(t, err, streams.ErrOffsetOutOfRange)
	ls, err = c.DeleteBefore(ctx, s, 0, -1)
	require.NoError(t, err)
	require.Equal(t, int64(10), ls)
	_, err = c.DeleteBefore(ctx, s, 1, 0)
	require.ErrorIs(t, err, streams.ErrPartitionNotFound)
}
