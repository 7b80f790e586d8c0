package streams_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// Reads by correlation id and by event type return a stream's matching events (and
// no other stream's) in (partition, offset) order, page by page; with the stream's
// read index enabled they read the index (its scans count rises), and disabling it
// drops it. Bad input is refused.
func TestReadByCorrelationAndType(t *testing.T) {
	// Not parallel: the read-index tests build and drop indexes of streamd.events
	// CONCURRENTLY, and each such statement waits for every transaction on the table,
	// those of the other read-index tests (one of which holds a transaction open on
	// purpose) among them: run one at a time, they do not wait for each other.
	ctx := context.Background()
	c, stream := setup(t, 3)
	_, other := setup(t, 1)
	var recs []streams.Record
	for i := 0; i < 300; i++ {
		corr := ""
		if i%50 == 7 {
			corr = "order-42"
		}
		typ := "Tick"
		if i%30 == 0 {
			typ = "OrderPlaced"
		}
		recs = append(recs, streams.Record{Stream: stream, Key: fmt.Sprint("k", i%11), EventType: typ, CorrelationID: corr,
			Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
	recs = append(recs, streams.Record{Stream: other, EventType: "OrderPlaced", CorrelationID: "order-42", Data: json.RawMessage(`{}`)})
	_, err := c.Produce(ctx, recs...)
	require.NoError(t, err)

	check := func() {
		t.Helper()
		got, err := c.ReadByCorrelationID(ctx, stream, "order-42", nil)
		require.NoError(t, err)
		require.Len(t, got, 6)
		for i, e := range got {
			require.Equal(t, "order-42", e.CorrelationID)
			require.Equal(t, stream, e.Stream)
			if i > 0 {
				prev := got[i-1]
				require.True(t, prev.Partition < e.Partition || (prev.Partition == e.Partition && prev.Offset < e.Offset))
			}
		}
		// Paging by type: 10 OrderPlaced events, 4 at a time.
		var all []streams.Event
		var after *streams.Position
		for {
			page, err := c.ReadByEventType(ctx, stream, "OrderPlaced", &streams.ReadByOpts{After: after, Limit: 4})
			require.NoError(t, err)
			if len(page) == 0 {
				break
			}
			all = append(all, page...)
			last := page[len(page)-1]
			after = &streams.Position{Partition: last.Partition, Offset: last.Offset}
		}
		require.Len(t, all, 10)
		seen := map[string]bool{}
		for _, e := range all {
			require.Equal(t, "OrderPlaced", e.EventType)
			require.False(t, seen[e.EventID], "no event twice across pages")
			seen[e.EventID] = true
		}
	}
	check() // no index: a scan of the stream

	idx, err := c.ReadIndexes(ctx, stream)
	require.NoError(t, err)
	require.Empty(t, idx)
	require.NoError(t, c.EnableReadIndex(ctx, stream, streams.ReadIndexCorrelationID))
	require.NoError(t, c.EnableReadIndex(ctx, stream, streams.ReadIndexEventType))
	require.NoError(t, c.EnableReadIndex(ctx, stream, streams.ReadIndexEventType), "idempotent")
	idx, err = c.ReadIndexes(ctx, stream)
	require.NoError(t, err)
	require.Len(t, idx, 2)
	for _, i := range idx {
		require.True(t, i.Valid)
	}
	scans := func() int64 {
		t.Helper()
		conn, err := testdb.Pool(t).Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		var n int64
		_, err = conn.Exec(ctx, `SELECT count(*) FROM streamd.read_events_by($1, 'correlation_id', 'order-42', -1, -1, 100)`, stream)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes
			WHERE schemaname = 'streamd' AND indexrelname = streamd.read_index_name($1, 'correlation_id')`, stream).Scan(&n))
		return n
	}
	first := scans()
	require.Greater(t, scans(), first, "the read uses the stream's correlation index")
	check()

	require.NoError(t, c.DisableReadIndex(ctx, stream, streams.ReadIndexCorrelationID))
	idx, err = c.ReadIndexes(ctx, stream)
	require.NoError(t, err)
	require.Len(t, idx, 1)
	require.Equal(t, streams.ReadIndexEventType, idx[0].Kind)
	require.NoError(t, c.DisableReadIndex(ctx, stream, streams.ReadIndexEventType))

	// Deleting the stream drops its read indexes (partial indexes on its name).
	require.NoError(t, c.EnableReadIndex(ctx, stream, streams.ReadIndexEventType))
	require.NoError(t, c.DeleteStream(ctx, stream))
	var left int
	require.NoError(t, c.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = ANY(ARRAY[
		streamd.read_index_name($1, 'correlation_id'), streamd.read_index_name($1, 'event_type')])`, stream).Scan(&left))
	require.Zero(t, left)

	// Bad input.
	missing := testdb.Name("missing")
	_, err = c.ReadByCorrelationID(ctx, missing, "x", nil)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
	require.ErrorIs(t, c.EnableReadIndex(ctx, missing, streams.ReadIndexEventType), streams.ErrStreamNotFound)
	require.ErrorIs(t, c.EnableReadIndex(ctx, other, "key"), streams.ErrInvalidArgument)
	_, err = c.ReadByEventType(ctx, other, "x", &streams.ReadByOpts{Limit: 10001})
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	_, err = c.ReadIndexes(ctx, "bad name")
	require.ErrorIs(t, err, streams.ErrInvalidName)
}

// TestEnableReadIndexRebuildsAnInvalidIndex: a CONCURRENTLY build that fails (here a
// unique index over a column two events share, a unique violation; a cancelled build
// or a deadlock victim does the same) leaves an INVALID index of the read index's
// name, which CREATE INDEX CONCURRENTLY IF NOT EXISTS silently kept: the stream
// looked indexed and every read scanned it. EnableReadIndex drops it and builds the
// read index.
func TestEnableReadIndexRebuildsAnInvalidIndex(t *testing.T) {
	// Not parallel: the read-index tests build and drop indexes of streamd.events
	// CONCURRENTLY, and each such statement waits for every transaction on the table,
	// those of the other read-index tests (one of which holds a transaction open on
	// purpose) among them: run one at a time, they do not wait for each other.
	ctx := context.Background()
	c, stream := setup(t, 1)
	_, err := c.Produce(ctx, streams.Record{Stream: stream, EventType: "A", Data: json.RawMessage(`{}`)},
		streams.Record{Stream: stream, EventType: "A", Data: json.RawMessage(`{}`)})
	require.NoError(t, err)
	var name string
	require.NoError(t, c.Pool().QueryRow(ctx, "SELECT streamd.read_index_name($1, 'event_type')", stream).Scan(&name))
	// Stream names are [A-Za-z0-9._-]: safe between quotes.
	// The build fails on the unique violation, leaving its INVALID index; one that
	// loses a deadlock to another test's index build or drop first (tests of every
	// package share the database) may fail before it made its index: build again.
	for {
		_, err = c.Pool().Exec(ctx, fmt.Sprintf(`CREATE UNIQUE INDEX CONCURRENTLY %s ON streamd.events (stream_name) WHERE stream_name = '%s'`,
			pgx.Identifier{name}.Sanitize(), stream))
		if sqlerr.Code(err) != "40P01" {
			break
		}
		require.NoError(t, c.DisableReadIndex(ctx, stream, streams.ReadIndexEventType))
	}
	require.Equal(t, "23505", sqlerr.Code(err), "the build fails on the unique violation: %v", err)
	idx, err := c.ReadIndexes(ctx, stream)
	require.NoError(t, err)
	require.Equal(t, []streams.ReadIndexInfo{{Kind: streams.ReadIndexEventType, Index: name, Valid: false}}, idx)

	require.NoError(t, c.EnableReadIndex(ctx, stream, streams.ReadIndexEventType))
	idx, err = c.ReadIndexes(ctx, stream)
	require.NoError(t, err)
	require.Equal(t, []streams.ReadIndexInfo{{Kind: streams.ReadIndexEventType, Index: name, Valid: true}}, idx)
	var def string
	require.NoError(t, c.Pool().QueryRow(ctx, "SELECT pg_get_indexdef(('streamd.' || quote_ident($1))::regclass)", name).Scan(&def))
	require.NotContains(t, def, "UNIQUE")
	require.Contains(t, def, "event_type")
	require.NoError(t, c.DisableReadIndex(ctx, stream, streams.ReadIndexEventType))
}

// TestDisableReadIndexRetriesALostDeadlock: DROP INDEX CONCURRENTLY waits for the
// transactions that hold locks on streamd.events while it holds the table's SHARE
// UPDATE EXCLUSIVE lock; a transaction that then asks for that lock (here a LOCK
// TABLE, as an ANALYZE does; in CI an append queued behind the drop's final lock did)
// closes a cycle, and PostgreSQL ends the drop. DisableReadIndex runs it again: the
// call succeeds once the other transaction is done. (It returned the deadlock;
// EnableReadIndex already retried its build.)
//
// Which side PostgreSQL ends is the one whose deadlock check, run once
// deadlock_timeout after it began to wait, finds the cycle: the drop's connections
// check after 5 s, and the test's transaction after 10 minutes, so the drop is the
// victim as long as the test's LOCK comes within 5 s of the drop's wait (with the
// default 1 s for both, a loaded machine let the drop's check pass before the cycle
// formed, and the test's transaction lost).
func TestDisableReadIndexRetriesALostDeadlock(t *testing.T) {
	// Not parallel: the read-index tests build and drop indexes of streamd.events
	// CONCURRENTLY, and each such statement waits for every transaction on the table,
	// those of the other read-index tests (one of which holds a transaction open on
	// purpose) among them: run one at a time, they do not wait for each other.
	ctx := context.Background()
	cfg := testdb.Config(t)
	cfg.ConnConfig.RuntimeParams["deadlock_timeout"] = "5s"
	dpool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(dpool.Close)
	c := streams.NewClient(dpool, nil)
	stream := testdb.Name("s")
	require.NoError(t, c.CreateStream(ctx, stream, 1))
	_, err = c.Produce(ctx, streams.Record{Stream: stream, EventType: "A", Data: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.NoError(t, c.EnableReadIndex(ctx, stream, streams.ReadIndexEventType))
	pool := testdb.Pool(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL deadlock_timeout = '10min'")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_type, data) VALUES ($1, 'B', '{}')`, stream)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- c.DisableReadIndex(ctx, stream, streams.ReadIndexEventType) }()
	// The drop waits for tx; tx then waits for the drop's table lock: a cycle.
	testdb.WaitForLockWait(t, pool, tx, "DROP INDEX")
	_, err = tx.Exec(ctx, "LOCK TABLE streamd.events IN SHARE UPDATE EXCLUSIVE MODE")
	require.NoError(t, err, "the drop lost the deadlock and let go of the table")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)
	idx, err := c.ReadIndexes(ctx, stream)
	require.NoError(t, err)
	require.Empty(t, idx)
}
