package streams_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// rowsTracer records the command tag of each query whose SQL contains match.
type rowsTracer struct {
	match string
	mu    sync.Mutex
	rows  []int64
}

func (r *rowsTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, r.match) {
		return context.WithValue(ctx, r, true)
	}
	return ctx
}

func (r *rowsTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ctx.Value(r) != nil && d.Err == nil {
		r.mu.Lock()
		r.rows = append(r.rows, d.CommandTag.RowsAffected())
		r.mu.Unlock()
	}
}

// TestFetchMaxBytesBoundsWhatTheServerSends: a Fetch of large events stops reading
// them at MaxBytes in the database, not only in what it returns: with 200 kB events and
// MaxBytes 300 kB the server sends 2 rows (the second crosses the bound and is cut in
// Go), not MaxRecords of them (it used to send all 100, 20 MB, to return one). The
// bound never drops the first event, whatever its size.
func TestFetchMaxBytesBoundsWhatTheServerSends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := testdb.Config(t)
	tr := &rowsTracer{match: "LEFT JOIN LATERAL"}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	c := streams.NewClient(pool, nil)
	s := testdb.Name("maxbytes")
	require.NoError(t, c.CreateStream(ctx, s, 1))
	recs := make([]streams.Record, 100)
	for i := range recs {
		// Random hex: PostgreSQL cannot compress it, so the stored size is the size.
		b := make([]byte, 100_000)
		for j := range b {
			b[j] = byte(rand.IntN(256))
		}
		recs[i] = streams.Record{Stream: s, Partition: streams.PartitionOf(0),
			Data: json.RawMessage(`"` + hex.EncodeToString(b) + `"`)}
	}
	_, err = c.Produce(ctx, recs...)
	require.NoError(t, err)

	res, err := c.Fetch(ctx, s, 0, 0, &streams.FetchOpts{MaxBytes: 300_000})
	require.NoError(t, err)
	require.Len(t, res.Events, 1)
	require.Equal(t, int64(1), res.NextOffset)
	res, err = c.Fetch(ctx, s, 0, 1, &streams.FetchOpts{MaxBytes: 10})
	require.NoError(t, err)
	require.Len(t, res.Events, 1, "the first event, whatever its size")
	res, err = c.Fetch(ctx, s, 0, 2, &streams.FetchOpts{MaxBytes: 1_000_000})
	require.NoError(t, err)
	require.Len(t, res.Events, 4)

	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.Equal(t, []int64{2, 1, 5}, tr.rows, "rows the server sent per fetch")
}

// TestFetchTakesAnyMaxBytesAndMaxRecords: MaxBytes and MaxRecords are Go ints; the
// fetch's byte bound must not narrow them to 32 bits (math.MaxInt meant as "no limit"
// failed to encode, and MaxInt32 overflowed at the log end).
func TestFetchTakesAnyMaxBytesAndMaxRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	_, err := c.Produce(ctx, streams.Record{Stream: s, Data: json.RawMessage(`1`)})
	require.NoError(t, err)
	for _, n := range []int{math.MaxInt32, 4 << 30, math.MaxInt} {
		for _, off := range []int64{0, 1} { // 1 is the log end
			res, err := c.Fetch(ctx, s, 0, off, &streams.FetchOpts{MaxBytes: n, MaxRecords: n})
			require.NoError(t, err, "MaxBytes and MaxRecords %d, offset %d", n, off)
			require.Len(t, res.Events, int(1-off))
		}
	}
}
