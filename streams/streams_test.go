package streams_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// setup returns a client and a new stream with the given partitions.
func setup(t *testing.T, partitions int32) (*streams.Client, string) {
	t.Helper()
	c := streams.NewClient(testdb.Pool(t), nil)
	name := testdb.Name("s")
	require.NoError(t, c.CreateStream(context.Background(), name, partitions))
	return c, name
}

func TestProduceFetchRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 3)
	recs := []streams.Record{
		{Stream: s, Key: "k1", EventType: "A", Data: json.RawMessage(`{"a":1}`), Headers: map[string]string{"h": "v"},
			CorrelationID: "corr", CausationID: "cause", Version: 2, EventID: "e1"},
		{Stream: s, Partition: streams.PartitionOf(2), Bytes: []byte{0, 1, 2}},
		{Stream: s, Partition: streams.PartitionOf(2)}, // tombstone
	}
	pos, err := c.Produce(ctx, recs...)
	require.NoError(t, err)
	require.Len(t, pos, 3)
	require.Equal(t, streams.PartitionForKey("k1", 3), pos[0].Partition)
	require.Equal(t, int32(2), pos[1].Partition)
	require.Equal(t, pos[1].Offset+1, pos[2].Offset)

	res, err := c.Fetch(ctx, s, pos[0].Partition, 0, nil)
	require.NoError(t, err)
	require.NotEmpty(t, res.Events)
	var got *streams.Event
	for i := range res.Events {
		if res.Events[i].EventID == "e1" {
			got = &res.Events[i]
		}
	}
	require.NotNil(t, got)
	require.JSONEq(t, `{"a":1}`, string(got.Data))
	require.Equal(t, "A", got.EventType)
	require.Equal(t, "k1", got.Key)
	require.Equal(t, map[string]string{"h": "v"}, got.Headers)
	require.Equal(t, "corr", got.CorrelationID)
	require.Equal(t, "cause", got.CausationID)
	require.Equal(t, int32(2), got.Version)

	res, err = c.Fetch(ctx, s, 2, pos[1].Offset, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, 2)
	require.Equal(t, []byte{0, 1, 2}, res.Events[0].Bytes)
	require.Nil(t, res.Events[0].Data)
	require.Nil(t, res.Events[1].Data)
	require.Nil(t, res.Events[1].Bytes)
	require.Equal(t, res.HighWatermark, res.NextOffset)
}

func TestDuplicateEventIDStoredOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	first, err := c.Produce(ctx, streams.Record{Stream: s, EventID: "x", Data: json.RawMessage(`1`)},
		streams.Record{Stream: s, EventID: "y", Data: json.RawMessage(`2`)})
	require.NoError(t, err)
	again, err := c.Produce(ctx,
		streams.Record{Stream: s, EventID: "a", Data: json.RawMessage(`0`)},
		streams.Record{Stream: s, EventID: "y", Data: json.RawMessage(`2`)},
		streams.Record{Stream: s, EventID: "z", Data: json.RawMessage(`3`)},
		streams.Record{Stream: s, EventID: "z", Data: json.RawMessage(`3`)})
	require.NoError(t, err)
	require.False(t, again[0].Duplicate)
	require.True(t, again[1].Duplicate)
	require.Equal(t, first[1].Offset, again[1].Offset)
	require.False(t, again[2].Duplicate)
	require.True(t, again[3].Duplicate)
	require.Equal(t, again[2].Offset, again[3].Offset)
	// Gapless: x=0 y=1 a=2 z=3.
	require.Equal(t, int64(2), again[0].Offset)
	require.Equal(t, int64(3), again[2].Offset)
	info, err := c.DescribeStream(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(4), info.PartitionInfo[0].NextOffset)
	res, err := c.Fetch(ctx, s, 0, 0, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, 4)
	for i, e := range res.Events {
		require.Equal(t, int64(i), e.Offset)
	}
}

func TestOffsetForTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	var stamps []time.Time
	for i := 0; i < 20; i++ {
		pos, err := c.Produce(ctx, streams.Record{Stream: s, Data: json.RawMessage(`{}`)})
		require.NoError(t, err)
		stamps = append(stamps, pos[0].Timestamp)
	}
	for i, ts := range stamps {
		off, err := c.OffsetForTime(ctx, s, 0, ts)
		require.NoError(t, err)
		// Timestamps are monotonic; equal stamps resolve to the first of them.
		require.LessOrEqual(t, off, int64(i))
		require.Equal(t, ts, stamps[off])
	}
	off, err := c.OffsetForTime(ctx, s, 0, stamps[19].Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, int64(20), off, "after every event: the log end")
	off, err = c.OffsetForTime(ctx, s, 0, time.Time{})
	require.NoError(t, err)
	require.Equal(t, int64(0), off)
}
