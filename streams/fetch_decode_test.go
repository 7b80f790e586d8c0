package streams_test

import (
	"context"
	"encoding/json"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestFetchDecodesAsPgxScans: Fetch decodes the rows it reads itself when they come
// in the binary format (the default), and scans them with pgx otherwise (the simple
// protocol sends text); both give the same events, for every kind of column value:
// keys or none or bytes, JSON or bytes or a tombstone, headers (a JSON object, and metadata
// that is not one), raw headers, correlation and causation ids, versions, and a
// MaxBytes cut that counts the key.
func TestFetchDecodesAsPgxScans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 2)
	_, err := c.Produce(ctx,
		streams.Record{Stream: s, Partition: streams.PartitionOf(0), Key: "k1", EventType: "A", Data: json.RawMessage(`{"a": "é😀", "n": [1, 2.5]}`),
			Headers: map[string]string{"h": "v", "n": "1"}, CorrelationID: "corr", CausationID: "cause", Version: 2, EventID: "e1"},
		streams.Record{Stream: s, Partition: streams.PartitionOf(0), Bytes: []byte{0, 1, 2, 0xff}},
		streams.Record{Stream: s, Partition: streams.PartitionOf(0), Bytes: []byte{}},
		streams.Record{Stream: s, Partition: streams.PartitionOf(0), Key: "", EventType: "T"},
	)
	require.NoError(t, err)
	_, err = c.AppendPartition(ctx, s, 0, []streams.Record{
		{Key: "kafka", Bytes: []byte("v"), RawHeaders: []streams.Header{{Key: "b", Value: []byte{0, 1}}, {Key: "a"}, {Key: "e", Value: []byte{}}}},
		{KeyBytes: []byte{0xff, 0, 1}, Bytes: []byte("binary key")},
	}, nil)
	require.NoError(t, err)
	pool := testdb.Pool(t)
	_, err = pool.Exec(ctx, `INSERT INTO streamd.events (stream_name, partition, event_type, key, data, metadata)
		VALUES ($1, 0, 'sql', 'kk', '"text"', '[1, 2]')`, s)
	require.NoError(t, err)

	textCfg := testdb.Config(t)
	textCfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	textPool, err := pgxpool.NewWithConfig(ctx, textCfg)
	require.NoError(t, err)
	t.Cleanup(textPool.Close)

	itself, err := streams.FetchDecodesItself(ctx, pool)
	require.NoError(t, err)
	require.True(t, itself, "the default query mode's rows are decoded by Fetch")
	itself, err = streams.FetchDecodesItself(ctx, textPool)
	require.NoError(t, err)
	require.False(t, itself, "the simple protocol's rows (all text) are scanned by pgx")
	for _, opts := range []*streams.FetchOpts{nil, {MaxBytes: 40}, {MaxRecords: 2}} {
		fast, err := streams.FetchTx(ctx, pool, s, 0, 0, opts)
		require.NoError(t, err)
		slow, err := streams.FetchTx(ctx, textPool, s, 0, 0, opts)
		require.NoError(t, err)
		require.NotEmpty(t, fast.Events)
		require.Len(t, fast.Events, len(slow.Events), "opts %+v", opts)
		for i := range fast.Events {
			f, sl := fast.Events[i], slow.Events[i]
			require.True(t, f.Timestamp.Equal(sl.Timestamp), "event %d: %v and %v", i, f.Timestamp, sl.Timestamp)
			require.Equal(t, time.Local, f.Timestamp.Location())
			f.Timestamp, sl.Timestamp = time.Time{}, time.Time{}
			require.Equal(t, sl, f, "event %d", i)
		}
		fast.Events, slow.Events = nil, nil
		require.Equal(t, slow, fast)
	}
	res, err := streams.FetchTx(ctx, pool, s, 0, 0, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, 7)
	require.Equal(t, []byte{0xff, 0, 1}, res.Events[5].KeyBytes)
	require.Equal(t, map[string]string{"metadata": "[1, 2]"}, res.Events[6].Headers, "metadata that is not an object")
	require.Equal(t, []byte{}, res.Events[2].Bytes, "empty bytes stay empty, not null")
	require.Nil(t, res.Events[3].Data)
	require.Nil(t, res.Events[3].Bytes)
}

// TestFetchOfASmallRecordAllocatesLittle: the payload buffer a fetch's records share
// starts at the size of what it holds, not at 64 KB: a reader at its log end (a
// consumer's partition worker, a Kafka tail reader) reads one small record per
// wake-up, and a 64 KB buffer per read, allocated and zeroed, was about a quarter of
// the CPU of the Kafka end-to-end bench's process (bench/RESULTS.md, session 14
// (kafka16)). Not parallel: it counts the process's allocations.
func TestFetchOfASmallRecordAllocatesLittle(t *testing.T) {
	ctx := context.Background()
	c, s := setup(t, 1)
	_, err := c.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(0), Data: json.RawMessage(`{"k":1}`)})
	require.NoError(t, err)
	pool := testdb.Pool(t)
	itself, err := streams.FetchDecodesItself(ctx, pool)
	require.NoError(t, err)
	require.True(t, itself)
	for range 10 { // warm: the pool's connection, its statement cache
		_, err := streams.FetchTx(ctx, pool, s, 0, 0, nil)
		require.NoError(t, err)
	}
	const n = 200
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		res, err := streams.FetchTx(ctx, pool, s, 0, 0, nil)
		require.NoError(t, err)
		require.Len(t, res.Events, 1)
		require.JSONEq(t, `{"k":1}`, string(res.Events[0].Data))
	}
	runtime.ReadMemStats(&after)
	perFetch := (after.TotalAlloc - before.TotalAlloc) / n
	t.Logf("%d bytes allocated per fetch of one record", perFetch)
	require.Less(t, perFetch, uint64(32<<10), "a fetch of one 7-byte record")
}
