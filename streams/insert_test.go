package streams_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestOneStatementAppendKeepsAGenericPlan: on one connection, the one-statement path's
// statements (oneSQL for one record, insertSQL for two and for a hundred) settle on
// PostgreSQL's generic plan after the five custom plans a prepared statement starts
// with, instead of being planned again on every call: planning was a fifth of the
// server's CPU for a one-record append (issue 21 §2; bench/RESULTS.md). Their row
// estimates must not depend on the parameters (no generate_series($n)).
func TestOneStatementAppendKeepsAGenericPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := testdb.Config(t)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	c := streams.NewClient(pool, nil)
	s := testdb.Name("generic")
	require.NoError(t, c.CreateStream(ctx, s, 2))

	before := streams.InsertAppends()
	for _, n := range []int{1, 2, 100} {
		for i := 0; i < 12; i++ {
			recs := make([]streams.Record, n)
			for j := range recs {
				recs[j] = streams.Record{Stream: s, Partition: streams.PartitionOf(int32(i % 2)), Data: json.RawMessage(`{"a":1}`)}
			}
			_, err := c.Produce(ctx, recs...)
			require.NoError(t, err)
		}
	}
	require.GreaterOrEqual(t, streams.InsertAppends()-before, int64(36), "every batch took the one-statement path")
	for _, q := range []struct {
		sql   string
		calls int64
	}{{streams.OneSQL, 12}, {streams.InsertSQL, 24}} {
		var generic, custom int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
			q.sql).Scan(&generic, &custom))
		require.LessOrEqual(t, custom, int64(5), "custom plans (generic %d) of %s", generic, q.sql)
		require.GreaterOrEqual(t, generic, q.calls-5, "generic plans (custom %d) of %s", custom, q.sql)
	}
}

// TestOneRecordAppend: a one-record Produce with an explicit partition takes the
// one-statement path (oneSQL), gets the next offset, and every field
// reads back as written; a retry of it (the same event id) falls back to
// streamd.append and is a duplicate at the original position; a payload over the
// limit and a partition the stream lacks fail with their typed errors and write
// nothing; a stream with per-key versions is declined and appended by streamd.append.
func TestOneRecordAppend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, 2)
	before := streams.InsertAppends()
	rec := streams.Record{Stream: s, Partition: streams.PartitionOf(1), EventID: "one", EventType: "T", Key: "k",
		Data: json.RawMessage(`{"a":1}`), Headers: map[string]string{"h": "v"}, CorrelationID: "corr", CausationID: "cause", Version: 7}
	pos, err := c.Produce(ctx, rec)
	require.NoError(t, err)
	require.Greater(t, streams.InsertAppends(), before, "the record took the one-statement path")
	require.Equal(t, streams.Position{Partition: 1, Offset: 0, Timestamp: pos[0].Timestamp}, pos[0])
	bin := streams.Record{Stream: s, Partition: streams.PartitionOf(1), Bytes: []byte{9, 8, 7}}
	pos2, err := c.Produce(ctx, bin)
	require.NoError(t, err)
	require.Equal(t, int64(1), pos2[0].Offset)
	tomb := streams.Record{Stream: s, Partition: streams.PartitionOf(1), Key: "k"}
	_, err = c.Produce(ctx, tomb)
	require.NoError(t, err)

	res, err := c.Fetch(ctx, s, 1, 0, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, 3)
	e := res.Events[0]
	require.Equal(t, "one", e.EventID)
	require.Equal(t, "T", e.EventType)
	require.Equal(t, "k", e.Key)
	require.JSONEq(t, `{"a":1}`, string(e.Data))
	require.Equal(t, map[string]string{"h": "v"}, e.Headers)
	require.Equal(t, "corr", e.CorrelationID)
	require.Equal(t, "cause", e.CausationID)
	require.Equal(t, int32(7), e.Version)
	require.True(t, e.Timestamp.Equal(pos[0].Timestamp))
	require.Equal(t, []byte{9, 8, 7}, res.Events[1].Bytes)
	require.Nil(t, res.Events[1].Data)
	require.Equal(t, int32(1), res.Events[1].Version)
	require.Nil(t, res.Events[2].Data)
	require.Nil(t, res.Events[2].Bytes)

	again, err := c.Produce(ctx, rec)
	require.NoError(t, err)
	require.True(t, again[0].Duplicate)
	require.Equal(t, int64(0), again[0].Offset)

	_, err = c.Pool().Exec(ctx, "UPDATE streamd.streams SET max_payload_bytes = 16 WHERE stream_name = $1", s)
	require.NoError(t, err)
	_, err = c.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(1), EventID: "big", Data: json.RawMessage(`{"b":"` + strings.Repeat("x", 32) + `"}`)})
	require.ErrorIs(t, err, streams.ErrPayloadTooLarge)
	_, err = c.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(2), EventID: "nowhere", Data: json.RawMessage(`{}`)})
	require.ErrorIs(t, err, streams.ErrPartitionNotFound)
	info, err := c.DescribeStream(ctx, s)
	require.NoError(t, err)
	require.Equal(t, int64(3), info.PartitionInfo[1].NextOffset, "nothing more was written, no offset taken")
	requireCount(t, c, s, 3)
}

// TestAppendOneLeavesTheTransactionUntrusted: streamd.append_one, called by SQL in a
// transaction that goes on (the outbox use, L2), leaves the trusted mark off as
// streamd.append() does: a later plain INSERT in that transaction still gets its
// offset from the trigger (L3), not the one it names. It used to leave the mark on,
// and the row was stored at the offset given, past the head.
func TestAppendOneLeavesTheTransactionUntrusted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, s := setup(t, 1)
	pool := testdb.Pool(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var base int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT (streamd.append_one($1, 0, 'a', '', NULL, '{}', NULL, NULL, NULL, NULL, 1)).base`,
		s).Scan(&base))
	require.Equal(t, int64(0), base)
	_, err = tx.Exec(ctx, `INSERT INTO streamd.events (stream_name, partition, "offset", event_id, data)
		VALUES ($1, 0, 500, 'b', '{}')`, s)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	var offsets []int64
	rows, err := pool.Query(ctx, `SELECT "offset" FROM streamd.events WHERE stream_name = $1 ORDER BY "offset"`, s)
	require.NoError(t, err)
	for rows.Next() {
		var o int64
		require.NoError(t, rows.Scan(&o))
		offsets = append(offsets, o)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{0, 1}, offsets, "the plain INSERT after append_one took the next offset")
}

// TestDefaultEventIDsAreTimeOrdered: records appended without an event id get UUIDv7
// ids, on every path (one record, the one-statement batch, keyed records through
// streamd.append, the Producer, AppendPartition's COPY, and the server's for a plain
// INSERT or streamd.append without ids), and the client's ids of each append sort
// after those of the append before, so the stream's unique event id index is
// written at its right-hand edge rather than on random leaves (issue 21 §2).
func TestDefaultEventIDsAreTimeOrdered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, s := setup(t, 2)
	rec := func(call string, partition int32, key string) streams.Record {
		r := streams.Record{Stream: s, EventType: call, Key: key, Data: json.RawMessage(`{"a":1}`)}
		if key == "" {
			r.Partition = streams.PartitionOf(partition)
		}
		return r
	}
	_, err := c.Produce(ctx, rec("c1", 0, ""))
	require.NoError(t, err)
	_, err = c.Produce(ctx, rec("c2", 0, ""), rec("c2", 0, ""))
	require.NoError(t, err)
	_, err = c.Produce(ctx, rec("c3", 0, "k"), rec("c3", 0, "l"))
	require.NoError(t, err)
	p, err := streams.NewProducer(pool, nil)
	require.NoError(t, err)
	_, err = p.Produce(ctx, rec("c4", 1, ""))
	require.NoError(t, err)
	require.NoError(t, p.Close(ctx))
	_, err = c.AppendPartition(ctx, s, 1, []streams.Record{{Stream: s, EventType: "c5", Bytes: []byte("x")}}, nil)
	require.NoError(t, err)
	// Ids the server makes (streamd.new_event_id): a plain INSERT without one, and
	// streamd.append given none. Version 7 too; not compared with the client's, whose
	// clock may share their millisecond.
	_, err = pool.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_type, data) VALUES ($1, 's1', '1')`, s)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT * FROM streamd.append($1, NULL, NULL, ARRAY['s2', 's2'], NULL, ARRAY['1', '2'], NULL, NULL, NULL, NULL, NULL)`, s)
	require.NoError(t, err)
	var serverIDs []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(event_id) FROM streamd.events WHERE stream_name = $1 AND event_type LIKE 's%'`, s).Scan(&serverIDs))
	require.Len(t, serverIDs, 3)
	for _, id := range serverIDs {
		u, err := uuid.Parse(id)
		require.NoError(t, err)
		require.Equal(t, uuid.Version(7), u.Version(), "server-made event id %s", id)
		require.Equal(t, uuid.RFC4122, u.Variant(), "server-made event id %s", id)
		require.WithinDuration(t, time.Now(), time.Unix(u.Time().UnixTime()), time.Minute, "server-made event id %s", id)
	}

	// The appends in the order they were made, and within each the ids sorted.
	rows, err := pool.Query(ctx, `SELECT event_id FROM streamd.events WHERE stream_name = $1 AND event_type LIKE 'c%' ORDER BY event_type, event_id`, s)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, ids, 7)
	for i, id := range ids {
		u, err := uuid.Parse(id)
		require.NoError(t, err)
		require.Equal(t, uuid.Version(7), u.Version(), "event id %d %s", i, id)
		if i > 0 {
			require.Less(t, ids[i-1], id, "event ids in the order they were made")
		}
	}
}
