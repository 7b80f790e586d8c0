package streams_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestBadInput: every kind of bad input gets its typed error, by every path (the
// client, the producer, plain SQL), and nothing is written.
func TestBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 2)
	pool := c.Pool()
	_, err := pool.Exec(ctx, "UPDATE streamd.streams SET max_payload_bytes = 64 WHERE stream_name = $1", s)
	require.NoError(t, err)
	prod, err := streams.NewProducer(pool, nil)
	require.NoError(t, err)
	defer prod.Close(ctx)

	big := json.RawMessage(`"` + strings.Repeat("x", 100) + `"`)
	ok := streams.Record{Stream: s, Data: json.RawMessage(`{"fine":true}`)}
	missing := "no-such-" + s

	produce := func(recs ...streams.Record) func() error {
		return func() error { _, err := c.Produce(ctx, recs...); return err }
	}
	produceOne := func(r streams.Record) func() error {
		return func() error { _, err := prod.Produce(ctx, r); return err }
	}
	sqlInsert := func(q string, args ...any) func() error {
		return func() error { _, err := pool.Exec(ctx, q, args...); return sqlerr.Wrap(err) }
	}
	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"unknown stream", produce(streams.Record{Stream: missing, Data: ok.Data}), streams.ErrStreamNotFound},
		{"invalid stream name", produce(streams.Record{Stream: "bad name!", Data: ok.Data}), streams.ErrInvalidName},
		{"empty stream name", produce(streams.Record{Data: ok.Data}), streams.ErrInvalidName},
		{"invalid JSON", produce(ok, streams.Record{Stream: s, Data: json.RawMessage(`{"a":`)}), streams.ErrInvalidJSON},
		// What json.Valid accepts and PostgreSQL refuses (they came back as bare PgErrors).
		{"JSON with \u0000", produce(ok, streams.Record{Stream: s, Data: json.RawMessage(`{"a":"\u0000"}`)}), streams.ErrInvalidJSON},
		{"JSON not UTF-8", produce(ok, streams.Record{Stream: s, Data: json.RawMessage("{\"a\":\"\xff\"}")}), streams.ErrInvalidJSON},
		{"key with NUL", produce(ok, streams.Record{Stream: s, Key: "k\x00", Data: ok.Data}), streams.ErrInvalidArgument},
		{"header not UTF-8", produce(ok, streams.Record{Stream: s, Headers: map[string]string{"h": "\xff"}, Data: ok.Data}), streams.ErrInvalidArgument},
		{"payload too large", produce(ok, streams.Record{Stream: s, Data: big}), streams.ErrPayloadTooLarge},
		{"binary payload too large", produce(ok, streams.Record{Stream: s, Bytes: make([]byte, 65)}), streams.ErrPayloadTooLarge},
		{"negative partition", produce(ok, streams.Record{Stream: s, Partition: streams.PartitionOf(-1), Data: ok.Data}), streams.ErrPartitionNotFound},
		{"partition past the end", produce(ok, streams.Record{Stream: s, Partition: streams.PartitionOf(2), Data: ok.Data}), streams.ErrPartitionNotFound},
		{"both payload kinds", produce(streams.Record{Stream: s, Data: ok.Data, Bytes: []byte{1}}), streams.ErrInvalidArgument},
		{"negative version", produce(streams.Record{Stream: s, Data: ok.Data, Version: -1}), streams.ErrInvalidArgument},

		{"producer: unknown stream", produceOne(streams.Record{Stream: missing, Data: ok.Data}), streams.ErrStreamNotFound},
		{"producer: payload too large", produceOne(streams.Record{Stream: s, Data: big}), streams.ErrPayloadTooLarge},
		{"producer: partition past the end", produceOne(streams.Record{Stream: s, Partition: streams.PartitionOf(9), Data: ok.Data}), streams.ErrPartitionNotFound},
		{"producer: invalid JSON", produceOne(streams.Record{Stream: s, Data: json.RawMessage(`nope`)}), streams.ErrInvalidJSON},

		{"sql: unknown stream", sqlInsert(`INSERT INTO streamd.events (stream_name, data) VALUES ($1, '{}')`, missing), streams.ErrStreamNotFound},
		{"sql: invalid stream name", sqlInsert(`INSERT INTO streamd.events (stream_name, data) VALUES ('bad name!', '{}')`), streams.ErrInvalidName},
		{"sql: partition past the end", sqlInsert(`INSERT INTO streamd.events (stream_name, partition, data) VALUES ($1, 2, '{}')`, s), streams.ErrPartitionNotFound},
		{"sql: negative partition", sqlInsert(`INSERT INTO streamd.events (stream_name, partition, data) VALUES ($1, -1, '{}')`, s), streams.ErrPartitionNotFound},
		{"sql: invalid JSON", sqlInsert(`INSERT INTO streamd.events (stream_name, data) VALUES ($1, '{"a":')`, s), streams.ErrInvalidJSON},
		{"sql: payload too large", sqlInsert(`INSERT INTO streamd.events (stream_name, data) VALUES ($1, $2::jsonb)`, s, string(big)), streams.ErrPayloadTooLarge},
		{"sql append: arrays of different lengths", sqlInsert(`SELECT * FROM streamd.append($1, NULL, ARRAY['a','b'], NULL, NULL, ARRAY['{}'], NULL, NULL, NULL, NULL, NULL)`, s), streams.ErrInvalidArgument},

		{"create: invalid name", func() error { return c.CreateStream(ctx, "", 1) }, streams.ErrInvalidName},
		{"create: zero partitions", func() error { return c.CreateStream(ctx, missing, 0) }, streams.ErrInvalidArgument},
		{"create: decrease partitions", func() error { return c.CreateStream(ctx, s, 1) }, streams.ErrPartitionsDecrease},
		{"sql create: decrease partitions", sqlInsert(`SELECT streamd.create_stream($1, 1)`, s), streams.ErrPartitionsDecrease},
		{"sql create: invalid name", sqlInsert(`SELECT streamd.create_stream('..', 1)`), streams.ErrInvalidName},
		{"delete: unknown stream", func() error { return c.DeleteStream(ctx, missing) }, streams.ErrStreamNotFound},

		{"fetch: negative offset", func() error { _, err := c.Fetch(ctx, s, 0, -1, nil); return err }, streams.ErrInvalidArgument},
		{"fetch: negative partition", func() error { _, err := c.Fetch(ctx, s, -1, 0, nil); return err }, streams.ErrPartitionNotFound},
		{"fetch: partition past the end", func() error { _, err := c.Fetch(ctx, s, 2, 0, nil); return err }, streams.ErrPartitionNotFound},
		{"fetch: unknown stream", func() error { _, err := c.Fetch(ctx, missing, 0, 0, nil); return err }, streams.ErrStreamNotFound},
		{"fetch: past the log end", func() error { _, err := c.Fetch(ctx, s, 0, 5, nil); return err }, streams.ErrOffsetOutOfRange},
		{"offset for time: unknown stream", func() error { _, err := c.OffsetForTime(ctx, missing, 0, time.Now()); return err }, streams.ErrStreamNotFound},
	}
	for _, tc := range cases {
		err := tc.call()
		require.Error(t, err, tc.name)
		require.ErrorIs(t, err, tc.want, "%s: got %v", tc.name, err)
		require.NotEmpty(t, err.Error())
		requireCount(t, c, s, 0)
		var stray int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.events WHERE stream_name IN ($1, 'bad name!', '', '..')", missing).Scan(&stray))
		require.Zero(t, stray, tc.name)
		var streamsNamed int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.streams WHERE stream_name IN ($1, '', '..')", missing).Scan(&streamsNamed))
		require.Zero(t, streamsNamed, tc.name)
	}
	// The stream still has its 2 partitions and empty heads.
	info, err := c.DescribeStream(ctx, s)
	require.NoError(t, err)
	require.Len(t, info.PartitionInfo, 2)
	for _, p := range info.PartitionInfo {
		require.Zero(t, p.NextOffset)
	}
}

// TestOffsetOutOfRangeSaysWhere: the error carries the valid range.
func TestOffsetOutOfRangeSaysWhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	_, err := c.Produce(ctx, ok3(s)...)
	require.NoError(t, err)
	// Simulate retention having deleted offsets 0 and 1.
	_, err = c.Pool().Exec(ctx, `DELETE FROM streamd.events WHERE stream_name = $1 AND "offset" < 2`, s)
	require.NoError(t, err)
	_, err = c.Pool().Exec(ctx, `UPDATE streamd.stream_partitions SET log_start_offset = 2 WHERE stream_name = $1`, s)
	require.NoError(t, err)
	_, err = c.Fetch(ctx, s, 0, 1, nil)
	var oor *streams.OffsetOutOfRangeError
	require.ErrorAs(t, err, &oor)
	require.Equal(t, int64(2), oor.LogStartOffset)
	require.Equal(t, int64(3), oor.NextOffset)
	res, err := c.Fetch(ctx, s, 0, 2, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, 1)
}

func ok3(s string) []streams.Record {
	return []streams.Record{
		{Stream: s, Data: json.RawMessage(`1`)}, {Stream: s, Data: json.RawMessage(`2`)}, {Stream: s, Data: json.RawMessage(`3`)},
	}
}

// TestEventsAreAppendOnly: an UPDATE of a stored event is refused.
func TestEventsAreAppendOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 1)
	_, err := c.Produce(ctx, ok3(s)...)
	require.NoError(t, err)
	_, err = c.Pool().Exec(ctx, `UPDATE streamd.events SET data = '{}' WHERE stream_name = $1`, s)
	require.ErrorIs(t, sqlerr.Wrap(err), streams.ErrInvalidArgument)
	_, err = c.Pool().Exec(ctx, `UPDATE streamd.events SET "offset" = "offset" + 10 WHERE stream_name = $1`, s)
	require.ErrorIs(t, sqlerr.Wrap(err), streams.ErrInvalidArgument)
	res, err := c.Fetch(ctx, s, 0, 0, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, 3)
	require.JSONEq(t, `1`, string(res.Events[0].Data))
}

// TestAppendReserveWithoutItsHeadRow: the COPY path's reservation fails with the
// typed error when the partition's head row is gone (a stream deleted while the COPY
// waited for it) instead of returning a row of NULLs the client could not scan.
func TestAppendReserveWithoutItsHeadRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	s := testdb.Name("reserve")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, s, 1))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "DELETE FROM streamd.stream_partitions WHERE stream_name = $1", s)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT * FROM streamd.append_reserve($1, 0, 3, 10)", s)
	require.ErrorIs(t, sqlerr.Wrap(err), streams.ErrPartitionNotFound)
}

// TestAppendSQLBatchIsItsLongestArray: streamd.append (and its event-sourcing path)
// takes the batch's size from all its arrays. Given only partitions and types (two
// tombstones) it stores two events; an empty event-id array beside two payloads is a
// length mismatch (SD005) that stores nothing. Both used to return no rows and store
// nothing, silently: the size came from the first non-NULL of four arrays.
func TestAppendSQLBatchIsItsLongestArray(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := streams.NewClient(pool, nil)
	for _, versioned := range []bool{false, true} {
		t.Run(fmt.Sprint("versioned=", versioned), func(t *testing.T) {
			s := testdb.Name("appendn")
			require.NoError(t, c.CreateStream(ctx, s, 2))
			if versioned {
				_, err := pool.Exec(ctx, "SELECT streamd.set_stream_event_sourcing($1, true, false)", s)
				require.NoError(t, err)
			}
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.append($1, ARRAY[0, 1], NULL,
				ARRAY['Deleted', 'Deleted'], NULL, NULL, NULL, NULL, NULL, NULL, NULL)`, s).Scan(&n))
			require.Equal(t, 2, n, "one row per event")
			_, err := pool.Exec(ctx, `SELECT * FROM streamd.append($1, NULL, '{}', NULL, NULL, ARRAY['1', '2'],
				NULL, NULL, NULL, NULL, NULL)`, s)
			require.ErrorIs(t, sqlerr.Wrap(err), streams.ErrInvalidArgument)
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.events WHERE stream_name = $1", s).Scan(&n))
			require.Equal(t, 2, n, "the two tombstones, nothing of the refused batch")
		})
	}
}

// TestAppendRacingDeleteStream: an append that waits for a head row while the stream
// is being deleted fails with ErrStreamNotFound once the deletion commits, on every
// append path (streamd.append, its event-sourcing path, a plain INSERT), as
// delete_stream promises; it used to say the stream had no partition 0.
func TestAppendRacingDeleteStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := streams.NewClient(pool, nil)
	for name, appendSQL := range map[string]string{
		"append":       `SELECT * FROM streamd.append($1, ARRAY[0], NULL, NULL, NULL, ARRAY['1'], NULL, NULL, NULL, NULL, NULL) -- racer`,
		"event store":  `SELECT * FROM streamd.append($1, ARRAY[0], NULL, NULL, NULL, ARRAY['1'], NULL, NULL, NULL, NULL, NULL) -- racer`,
		"plain insert": `INSERT INTO streamd.events (stream_name, partition, data) VALUES ($1, 0, '1') -- racer`,
	} {
		t.Run(name, func(t *testing.T) {
			s := testdb.Name("delrace")
			require.NoError(t, c.CreateStream(ctx, s, 1))
			if name == "event store" {
				_, err := pool.Exec(ctx, "SELECT streamd.set_stream_event_sourcing($1, true, false)", s)
				require.NoError(t, err)
			}
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "SELECT streamd.delete_stream($1)", s)
			require.NoError(t, err)
			appended := make(chan error, 1)
			go func() { _, err := pool.Exec(ctx, appendSQL, s); appended <- err }()
			testdb.WaitForLockWait(t, pool, tx, "-- racer")
			require.NoError(t, tx.Commit(ctx))
			err = sqlerr.Wrap(<-appended)
			require.ErrorIs(t, err, streams.ErrStreamNotFound)
		})
	}
}
