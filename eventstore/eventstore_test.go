package eventstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/eventstore"
	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/internal/testmetrics"
	"github.com/streamd/streamd/streams"
)

type fixture struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	client *streams.Client
	store  *eventstore.Store
	stream string
}

// setup creates a stream with key versions and a store on it.
func setup(t *testing.T, cfg *eventstore.Config) *fixture {
	t.Helper()
	f := &fixture{ctx: context.Background(), pool: testdb.Pool(t), stream: testdb.Name("es")}
	f.client = streams.NewClient(f.pool, nil)
	require.NoError(t, f.client.CreateStream(f.ctx, f.stream, 4))
	var err error
	f.store, err = eventstore.New(f.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, f.store.ConfigureStream(f.ctx, f.stream, eventstore.StreamOpts{KeyVersions: true}))
	return f
}

func ev(typ string, n int) eventstore.Event {
	return eventstore.Event{EventType: typ, Data: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
}

func (f *fixture) count(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(f.ctx, "SELECT count(*) FROM streamd.events WHERE stream_name = $1", f.stream).Scan(&n))
	return n
}

// Versions are 1, 2, 3, ... per key, across batches and keys, and Read returns a key's
// events in version order.
func TestVersionsPerKey(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	r, err := f.store.Append(f.ctx, f.stream, "a", eventstore.NoVersion, ev("x", 1), ev("x", 2))
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2}, r.Versions)
	require.Equal(t, int64(2), r.Version)
	r, err = f.store.Append(f.ctx, f.stream, "b", eventstore.AnyVersion, ev("x", 1))
	require.NoError(t, err)
	require.Equal(t, []int64{1}, r.Versions)
	r, err = f.store.Append(f.ctx, f.stream, "a", eventstore.ExactVersion(2), ev("x", 3))
	require.NoError(t, err)
	require.Equal(t, []int64{3}, r.Versions)

	got, err := f.store.Read(f.ctx, f.stream, "a", 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 3)
	for i, e := range got {
		require.Equal(t, int64(i+1), e.KeyVersion)
		require.JSONEq(t, fmt.Sprintf(`{"n":%d}`, i+1), string(e.Data))
	}
	got, err = f.store.Read(f.ctx, f.stream, "a", 1, 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, int64(2), got[0].KeyVersion)
	v, err := f.store.Version(f.ctx, f.stream, "a")
	require.NoError(t, err)
	require.Equal(t, int64(3), v)
	v, err = f.store.Version(f.ctx, f.stream, "nobody")
	require.NoError(t, err)
	require.Equal(t, int64(0), v)

	// The key's events are read by a range scan of the partial index.
	var plan string
	require.NoError(t, f.pool.QueryRow(f.ctx, `EXPLAIN (FORMAT TEXT) SELECT * FROM streamd.events e
		WHERE e.stream_name = $1 AND e.key = $2 AND e.key_version > $3 ORDER BY e.key_version`, f.stream, "a", 0).Scan(&plan))
	require.Contains(t, plan, "events_stream_key_version")
}

// A wrong expected version fails with ErrVersionMismatch and writes nothing, neither
// the events nor the key's version.
func TestExpectedVersionMismatchWritesNothing(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	f := setup(t, &eventstore.Config{Registerer: reg})
	_, err := f.store.Append(f.ctx, f.stream, "k", eventstore.NoVersion, ev("x", 1))
	require.NoError(t, err)
	for _, exp := range []eventstore.ExpectedVersion{eventstore.NoVersion, eventstore.ExactVersion(2), eventstore.ExactVersion(7)} {
		_, err = f.store.Append(f.ctx, f.stream, "k", exp, ev("x", 2), ev("x", 3))
		require.ErrorIs(t, err, eventstore.ErrVersionMismatch, "expected %d", exp)
		require.Contains(t, err.Error(), "is at version 1")
	}
	require.Equal(t, 1, f.count(t))
	v, err := f.store.Version(f.ctx, f.stream, "k")
	require.NoError(t, err)
	require.Equal(t, int64(1), v)
	r, err := f.store.Append(f.ctx, f.stream, "k", eventstore.ExactVersion(1), ev("x", 2))
	require.NoError(t, err)
	require.Equal(t, int64(2), r.Version)
	require.Equal(t, 3.0, testmetrics.Value(t, reg, "streamd_eventstore_appends_total", "result", "version_mismatch"))
	require.Equal(t, 2.0, testmetrics.Value(t, reg, "streamd_eventstore_appends_total", "result", "ok"))
}

// Two writers race on one key with the same expected version: exactly one wins, the
// other gets ErrVersionMismatch, and the key holds the winner's events only.
func TestRacingWritersExactlyOneWins(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for round := range 20 {
		key := fmt.Sprintf("race-%d", round)
		_, err := f.store.Append(f.ctx, f.stream, key, eventstore.NoVersion, ev("init", 0))
		require.NoError(t, err)
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, 2)
		for w := range 2 {
			wg.Add(1)
			go func() { // owner: this test; exits after one append
				defer wg.Done()
				<-start
				_, errs[w] = f.store.Append(f.ctx, f.stream, key, eventstore.ExactVersion(1), ev(fmt.Sprintf("w%d", w), w), ev(fmt.Sprintf("w%d", w), w))
			}()
		}
		close(start)
		wg.Wait()
		wins := 0
		winner := -1
		for w, err := range errs {
			if err == nil {
				wins++
				winner = w
			} else {
				require.ErrorIs(t, err, eventstore.ErrVersionMismatch)
			}
		}
		require.Equal(t, 1, wins, "round %d: %v", round, errs)
		got, err := f.store.Read(f.ctx, f.stream, key, 0, 0)
		require.NoError(t, err)
		require.Len(t, got, 3)
		require.Equal(t, fmt.Sprintf("w%d", winner), got[1].EventType)
		require.Equal(t, fmt.Sprintf("w%d", winner), got[2].EventType)
	}
}

// Writers racing without expectations all succeed, and the key's versions stay
// 1..N with no gap or repeat (the head row serialises them).
func TestConcurrentAppendsKeepVersionsDense(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	const writers, each = 6, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() { // owner: this test; exits after its appends
			defer wg.Done()
			for i := range each {
				_, err := f.store.Append(f.ctx, f.stream, "hot", eventstore.AnyVersion, ev("x", w*100+i))
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	got, err := f.store.Read(f.ctx, f.stream, "hot", 0, 0)
	require.NoError(t, err)
	require.Len(t, got, writers*each)
	for i, e := range got {
		require.Equal(t, int64(i+1), e.KeyVersion)
	}
}

// Every append path numbers keys on a versioned stream: the producer and a plain SQL
// INSERT, whose key_version is checked as an expectation, never trusted.
func TestOtherAppendPathsGetVersions(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	pos, err := f.client.Produce(f.ctx, streams.Record{Stream: f.stream, Key: "p", Data: json.RawMessage(`1`)},
		streams.Record{Stream: f.stream, Key: "p", Data: json.RawMessage(`2`)})
	require.NoError(t, err)
	require.Len(t, pos, 2)
	_, err = f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, key, data) VALUES ($1, 'p', '3')`, f.stream)
	require.NoError(t, err)
	_, err = f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, key, data, key_version) VALUES ($1, 'p', '4', 4)`, f.stream)
	require.NoError(t, err)
	_, err = f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, key, data, key_version) VALUES ($1, 'p', '5', 4)`, f.stream)
	require.ErrorIs(t, wrap(err), eventstore.ErrVersionMismatch)
	got, err := f.store.Read(f.ctx, f.stream, "p", 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 4)
	for i, e := range got {
		require.Equal(t, int64(i+1), e.KeyVersion)
		require.Equal(t, fmt.Sprint(i+1), string(e.Data))
	}
	// A stream without key versions leaves key_version NULL; a seed-style INSERT that
	// names the column with NULL works (one with a value is refused:
	// TestInsertKeyVersionIsNeverDropped).
	plain := testdb.Name("plain")
	require.NoError(t, f.client.CreateStream(f.ctx, plain, 1))
	_, err = f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, key, data, key_version) VALUES ($1, 'p', '1', NULL)`, plain)
	require.NoError(t, err)
	var n int
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM streamd.events WHERE stream_name = $1 AND key_version IS NULL`, plain).Scan(&n))
	require.Equal(t, 1, n)
	_, err = f.store.Append(f.ctx, plain, "k", eventstore.NoVersion, ev("x", 1))
	require.ErrorIs(t, err, eventstore.ErrNotVersioned)
	// With AnyVersion too (it appended, reporting version 0).
	_, err = f.store.Append(f.ctx, plain, "k", eventstore.AnyVersion, ev("x", 1))
	require.ErrorIs(t, err, eventstore.ErrNotVersioned)
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM streamd.events WHERE stream_name = $1`, plain).Scan(&n))
	require.Equal(t, 1, n, "nothing written")
}

// A retried append (same event ids) returns the stored versions and writes nothing
// twice, even though its expected version is no longer true.
func TestRetryIsIdempotent(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	e1, e2 := ev("x", 1), ev("x", 2)
	e1.EventID, e2.EventID = "id-1", "id-2"
	r1, err := f.store.Append(f.ctx, f.stream, "k", eventstore.NoVersion, e1, e2)
	require.NoError(t, err)
	r2, err := f.store.Append(f.ctx, f.stream, "k", eventstore.NoVersion, e1, e2)
	require.NoError(t, err)
	require.Equal(t, r1.Versions, r2.Versions)
	require.True(t, r2.Positions[0].Duplicate)
	require.Equal(t, r1.Positions[1].Offset, r2.Positions[1].Offset)
	require.Equal(t, 2, f.count(t))
}

// Bad input gets a typed error naming what was wrong, and nothing is written.
func TestBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"empty key", func() error {
			_, err := f.store.Append(f.ctx, f.stream, "", eventstore.AnyVersion, ev("x", 1))
			return err
		}, streams.ErrInvalidArgument},
		{"negative expected version", func() error {
			_, err := f.store.Append(f.ctx, f.stream, "k", eventstore.ExactVersion(-5), ev("x", 1))
			return err
		}, streams.ErrInvalidArgument},
		{"no events", func() error { _, err := f.store.Append(f.ctx, f.stream, "k", eventstore.AnyVersion); return err }, streams.ErrInvalidArgument},
		{"invalid JSON", func() error {
			_, err := f.store.Append(f.ctx, f.stream, "k", eventstore.AnyVersion, eventstore.Event{Data: json.RawMessage(`{`)})
			return err
		}, streams.ErrInvalidJSON},
		{"unknown stream", func() error {
			_, err := f.store.Append(f.ctx, testdb.Name("missing"), "k", eventstore.AnyVersion, ev("x", 1))
			return err
		}, streams.ErrStreamNotFound},
		{"snapshot beyond the key's version", func() error {
			return f.store.SaveSnapshot(f.ctx, f.stream, "k", 3, eventstore.SnapshotData{Data: json.RawMessage(`{}`)})
		}, streams.ErrInvalidArgument},
		{"open with negative timeout", func() error {
			_, err := f.store.Open(f.ctx, f.stream, "k", &eventstore.OpenOpts{SessionTimeout: -time.Second})
			return err
		}, streams.ErrInvalidArgument},
	}
	for _, c := range cases {
		require.ErrorIs(t, c.call(), c.want, c.name)
	}
	require.Equal(t, 0, f.count(t))
	_, err := eventstore.New(f.pool, &eventstore.Config{OpenTimeout: -1})
	require.ErrorContains(t, err, "Config.OpenTimeout")
}

// TestPartlyStoredAppendIsAMismatch: an append whose first event (the one carrying the
// expected version) another append already stored, with new events after it, fails
// with ErrVersionMismatch and writes nothing; its new events used to be appended with
// no version check at all.
func TestPartlyStoredAppendIsAMismatch(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	a := ev("x", 1)
	a.EventID = "cmd-1/0"
	_, err := f.store.Append(f.ctx, f.stream, "k", eventstore.NoVersion, a)
	require.NoError(t, err)
	b := ev("x", 2)
	b.EventID = "cmd-1/1"
	_, err = f.store.Append(f.ctx, f.stream, "k", eventstore.NoVersion, a, b)
	require.ErrorIs(t, err, eventstore.ErrVersionMismatch)
	require.Equal(t, 1, f.count(t), "nothing written")
	// A full retry of the first append still succeeds (all duplicates).
	_, err = f.store.Append(f.ctx, f.stream, "k", eventstore.NoVersion, a)
	require.NoError(t, err)
}

// TestConcurrentDuplicateInsertKeepsVersionsGapless: two plain INSERTs of the same
// event id and key, the second waiting for the first (ON CONFLICT DO NOTHING): the key
// gets one version for the one event stored. The second used to move the key's version
// before its row was dropped, leaving a version with no event.
func TestConcurrentDuplicateInsertKeepsVersionsGapless(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	tx1, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = tx1.Rollback(f.ctx) }()
	const ins = `INSERT INTO streamd.events (stream_name, key, event_id, data) VALUES ($1, 'k', 'same-id', '1')
		ON CONFLICT (stream_name, event_id) DO NOTHING`
	_, err = tx1.Exec(f.ctx, ins, f.stream)
	require.NoError(t, err)
	second := make(chan error, 1)
	go func() { _, err := f.pool.Exec(f.ctx, ins, f.stream); second <- err }()
	testdb.WaitForLockWait(t, f.pool, tx1, "same-id")
	require.NoError(t, tx1.Commit(f.ctx))
	require.NoError(t, <-second)
	var events, version int64
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM streamd.events WHERE stream_name = $1 AND key = 'k'`, f.stream).Scan(&events))
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT last_version FROM streamd.key_heads WHERE stream_name = $1 AND key = 'k'`, f.stream).Scan(&version))
	require.Equal(t, int64(1), events)
	require.Equal(t, events, version, "the key's version counts its events")
}

// TestAppendRacingASettingsChangeIsRetried: an append that read a stream's settings
// and then waited for its head rows while set_stream_event_sourcing turned key
// versions on fails with a retriable serialization failure (40001) instead of
// appending keyed events without versions; its retry numbers them. The same in a
// REPEATABLE READ transaction whose snapshot predates the settings: it read the old
// settings and can read nothing newer, so only the head rows' new versions (written,
// not only locked, by the settings change) fail it; with them only locked it stored
// keyed events without versions.
func TestAppendRacingASettingsChangeIsRetried(t *testing.T) {
	t.Parallel()
	const appendSQL = `SELECT * FROM streamd.append($1, NULL, NULL, NULL, ARRAY['k'], ARRAY['1'], NULL, NULL, NULL, NULL, NULL)`
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			c := streams.NewClient(pool, nil)
			s := testdb.Name("esrace")
			require.NoError(t, c.CreateStream(ctx, s, 1))

			app, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			require.NoError(t, err)
			defer func() { _ = app.Rollback(ctx) }()
			_, err = app.Exec(ctx, "SELECT 1") // the appender's snapshot, for REPEATABLE READ
			require.NoError(t, err)
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "SELECT streamd.set_stream_event_sourcing($1, true, false)", s)
			require.NoError(t, err)
			appended := make(chan error, 1)
			go func() {
				_, err := app.Exec(ctx, appendSQL, s)
				appended <- err
			}()
			testdb.WaitForLockWait(t, pool, tx, "streamd.append(")
			require.NoError(t, tx.Commit(ctx))
			err = <-appended
			require.Equal(t, "40001", sqlerr.Code(err), "%v", err)
			require.True(t, sqlerr.Retriable(err))
			require.NoError(t, app.Rollback(ctx))
			_, err = pool.Exec(ctx, appendSQL, s) // the retry
			require.NoError(t, err)
			var kv *int64
			var n int64
			require.NoError(t, pool.QueryRow(ctx, "SELECT max(key_version), count(*) FROM streamd.events WHERE stream_name = $1", s).Scan(&kv, &n))
			require.EqualValues(t, 1, n, "only the retry stored its event")
			require.NotNil(t, kv, "the retry's event is versioned")
			require.EqualValues(t, 1, *kv)
		})
	}
}

// TestInsertKeyVersionIsNeverDropped: a plain INSERT's key_version is an expected
// version, checked or refused, never dropped: on a stream without key versions it is
// ErrNotVersioned (as Store.Append), on a versioned stream without a key it is
// streams.ErrInvalidArgument (as append_versioned's expectation without a key). Both
// used to be set to NULL silently, so two writers that both expected version 1 both
// succeeded. NULL, or no key_version, is no expectation.
func TestInsertKeyVersionIsNeverDropped(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	plain := testdb.Name("plain")
	require.NoError(t, f.client.CreateStream(f.ctx, plain, 2))
	for i := range 2 {
		_, err := f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, key, data, key_version) VALUES ($1, 'k', '1', 1)`, plain)
		require.ErrorIs(t, wrap(err), eventstore.ErrNotVersioned, "writer %d", i)
	}
	_, err := f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, data, key_version) VALUES ($1, '1', 1)`, plain)
	require.ErrorIs(t, wrap(err), eventstore.ErrNotVersioned, "keyless")
	_, err = f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, key, data, key_version) VALUES ($1, 'k', '1', NULL)`, plain)
	require.NoError(t, err, "seed style: key_version NULL")
	var n int
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM streamd.events WHERE stream_name = $1`, plain).Scan(&n))
	require.Equal(t, 1, n)

	_, err = f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, data, key_version) VALUES ($1, '1', 7)`, f.stream)
	require.ErrorIs(t, wrap(err), streams.ErrInvalidArgument)
	require.ErrorContains(t, err, "needs a key")
	_, err = f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, data, key_version) VALUES ($1, '1', NULL)`, f.stream)
	require.NoError(t, err)
	require.Equal(t, 1, f.count(t))
}

// TestEventIDOfAnotherKeyIsRefused: on a versioned stream, an append whose event id is
// stored under another key is refused with streams.ErrInvalidArgument and writes
// nothing, on every append path; it is not a retry of that other key's event. It used
// to succeed as a duplicate and report the other key's position and version (Versions
// [4] while the key was at version 0). A retry under the same key still succeeds.
func TestEventIDOfAnotherKeyIsRefused(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for i := range 3 {
		_, err := f.store.Append(f.ctx, f.stream, "b", eventstore.AnyVersion, ev("x", i))
		require.NoError(t, err)
	}
	shared := ev("x", 9)
	shared.EventID = "shared-id"
	_, err := f.store.Append(f.ctx, f.stream, "b", eventstore.AnyVersion, shared)
	require.NoError(t, err)
	fresh := ev("x", 10)
	fresh.EventID = "fresh-id"

	for _, batch := range [][]eventstore.Event{{shared}, {fresh, shared}} {
		_, err = f.store.Append(f.ctx, f.stream, "a", eventstore.NoVersion, batch...)
		require.ErrorIs(t, err, streams.ErrInvalidArgument, "batch of %d", len(batch))
		require.ErrorContains(t, err, `is stored under key 'b', not 'a'`)
	}
	_, err = f.client.Produce(f.ctx, streams.Record{Stream: f.stream, Key: "a", EventID: "shared-id", Data: json.RawMessage(`1`)})
	require.ErrorIs(t, err, streams.ErrInvalidArgument, "producer")
	_, err = f.client.Produce(f.ctx, streams.Record{Stream: f.stream, EventID: "shared-id", Data: json.RawMessage(`1`)})
	require.ErrorIs(t, err, streams.ErrInvalidArgument, "producer, keyless")
	_, err = f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, key, event_id, data) VALUES ($1, 'a', 'shared-id', '1')`, f.stream)
	require.ErrorIs(t, wrap(err), streams.ErrInvalidArgument, "plain INSERT")

	v, err := f.store.Version(f.ctx, f.stream, "a")
	require.NoError(t, err)
	require.Equal(t, int64(0), v)
	require.Equal(t, 4, f.count(t), "nothing written")

	r, err := f.store.Append(f.ctx, f.stream, "b", eventstore.AnyVersion, shared)
	require.NoError(t, err, "a retry under the event's own key")
	require.True(t, r.Positions[0].Duplicate)
	require.Equal(t, []int64{4}, r.Versions)
	tag, err := f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, key, event_id, data) VALUES ($1, 'b', 'shared-id', '1')`, f.stream)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected(), "a plain INSERT retry is skipped")
}

// TestReadChecksTheStream: Read of a stream that does not exist, or does not keep key
// versions, fails as Version and Load do (streams.ErrStreamNotFound, ErrNotVersioned);
// a key without events reads as empty. Read used to return no events and no error.
func TestReadChecksTheStream(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, err := f.store.Read(f.ctx, testdb.Name("missing"), "k", 0, 0)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
	plain := testdb.Name("plain")
	require.NoError(t, f.client.CreateStream(f.ctx, plain, 1))
	_, err = f.client.Produce(f.ctx, streams.Record{Stream: plain, Key: "k", Data: json.RawMessage(`1`)})
	require.NoError(t, err)
	_, err = f.store.Read(f.ctx, plain, "k", 0, 0)
	require.ErrorIs(t, err, eventstore.ErrNotVersioned)
	_, _, err = f.store.Load(f.ctx, plain, "k")
	require.ErrorIs(t, err, eventstore.ErrNotVersioned)
	_, _, err = f.store.Load(f.ctx, testdb.Name("missing"), "k")
	require.ErrorIs(t, err, streams.ErrStreamNotFound)

	got, err := f.store.Read(f.ctx, f.stream, "nobody", 0, 0)
	require.NoError(t, err)
	require.Empty(t, got)
}
