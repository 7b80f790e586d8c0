package streams_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/streams"
)

func bigBatch(s string, partition int32, n int, idPrefix string) []streams.Record {
	recs := make([]streams.Record, n)
	for i := range recs {
		recs[i] = streams.Record{Stream: s, Partition: streams.PartitionOf(partition), EventType: "T",
			Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
		if idPrefix != "" {
			recs[i].EventID = fmt.Sprintf("%s-%d", idPrefix, i)
		}
	}
	return recs
}

// TestCopyAppendRoundTrip: a one-partition batch takes the one-statement path up to
// 256 records and COPY above, gets gapless offsets, and every field reads back as
// written.
func TestCopyAppendRoundTrip(t *testing.T) {
	t.Parallel()
	t.Run("insert", func(t *testing.T) { t.Parallel(); testFastAppendRoundTrip(t, 100, streams.InsertAppends) })
	t.Run("copy", func(t *testing.T) { t.Parallel(); testFastAppendRoundTrip(t, 300, streams.CopyAppends) })
}

func testFastAppendRoundTrip(t *testing.T, n int, taken func() int64) {
	ctx := context.Background()
	c, s := setup(t, 2)
	before := taken()
	recs := bigBatch(s, 1, n, "")
	recs[3].Key, recs[3].Headers, recs[3].CorrelationID, recs[3].CausationID, recs[3].Version = "k", map[string]string{"h": "v"}, "corr", "cause", 7
	recs[4].Data, recs[4].Bytes = nil, []byte{9, 8, 7}
	recs[5].Data = nil // tombstone
	pos, err := c.Produce(ctx, recs...)
	require.NoError(t, err)
	require.Greater(t, taken(), before, "the batch took the path of its size")
	for i, p := range pos {
		require.Equal(t, int32(1), p.Partition)
		require.Equal(t, int64(i), p.Offset)
		require.False(t, p.Duplicate)
	}
	res, err := c.Fetch(ctx, s, 1, 0, &streams.FetchOpts{MaxRecords: 1000})
	require.NoError(t, err)
	require.Len(t, res.Events, n)
	e := res.Events[3]
	require.Equal(t, "k", e.Key)
	require.Equal(t, map[string]string{"h": "v"}, e.Headers)
	require.Equal(t, "corr", e.CorrelationID)
	require.Equal(t, "cause", e.CausationID)
	require.Equal(t, int32(7), e.Version)
	require.Equal(t, []byte{9, 8, 7}, res.Events[4].Bytes)
	require.Nil(t, res.Events[4].Data)
	require.Nil(t, res.Events[5].Data)
	require.Nil(t, res.Events[5].Bytes)
	last := res.Events[n-1]
	require.JSONEq(t, fmt.Sprintf(`{"i":%d}`, n-1), string(last.Data))
	require.Equal(t, "T", last.EventType)
	require.Equal(t, int32(1), last.Version)
	require.NotEmpty(t, last.EventID)
}

// TestCopyAppendRetryFallsBackAndDedups: a retried large batch (same event ids) cannot
// take COPY (unique violation); it falls back to streamd.append, stores nothing twice,
// returns the original positions, and leaves no hole.
func TestCopyAppendRetryFallsBackAndDedups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	first, err := c.Produce(ctx, bigBatch(s, 0, 50, "id")...)
	require.NoError(t, err)
	mixed := append(bigBatch(s, 0, 50, "id"), bigBatch(s, 0, 10, "new")...)
	again, err := c.Produce(ctx, mixed...)
	require.NoError(t, err)
	for i := 0; i < 50; i++ {
		require.True(t, again[i].Duplicate)
		require.Equal(t, first[i].Offset, again[i].Offset)
	}
	for i := 50; i < 60; i++ {
		require.False(t, again[i].Duplicate)
		require.Equal(t, int64(i), again[i].Offset, "new records continue the log without a hole")
	}
	requireCount(t, c, s, 60)
	info, err := c.DescribeStream(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(60), info.PartitionInfo[0].NextOffset)
}

// TestCopyAppendBadInputWritesNothing: a large batch with a payload over the limit
// or invalid JSON fails with the typed error and writes nothing.
func TestCopyAppendBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	_, err := c.Pool().Exec(ctx, "UPDATE streamd.streams SET max_payload_bytes = 64 WHERE stream_name = $1", s)
	require.NoError(t, err)
	recs := bigBatch(s, 0, 40, "")
	recs[7].Data = json.RawMessage(`"` + strings.Repeat("x", 100) + `"`)
	_, err = c.Produce(ctx, recs...)
	require.ErrorIs(t, err, streams.ErrPayloadTooLarge)
	recs = bigBatch(s, 0, 40, "")
	recs[7].Data = json.RawMessage(`{"broken":`)
	_, err = c.Produce(ctx, recs...)
	require.ErrorIs(t, err, streams.ErrInvalidJSON)
	recs = bigBatch(s, 0, 40, "")
	recs[7].Partition = streams.PartitionOf(3)
	_, err = c.Produce(ctx, recs...)
	require.ErrorIs(t, err, streams.ErrPartitionNotFound)
	requireCount(t, c, s, 0)
	info, err := c.DescribeStream(ctx, s)
	require.NoError(t, err)
	require.Zero(t, info.PartitionInfo[0].NextOffset)
}
