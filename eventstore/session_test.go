package eventstore_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/eventstore"
	"github.com/streamd/streamd/streams"
)

// clock is a settable time for session expiry.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// A session that expired cannot append (nor snapshot); renewing it before anyone
// else took the key lets it append again.
func TestExpiredSessionCannotAppend(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	f := setup(t, &eventstore.Config{Clock: clk.now, SessionTimeout: time.Minute})
	sess, err := f.store.Open(f.ctx, f.stream, "k", nil)
	require.NoError(t, err)
	require.Equal(t, clk.now().Add(time.Minute), sess.ExpiresAt().UTC())
	_, err = sess.Append(f.ctx, eventstore.NoVersion, ev("x", 1))
	require.NoError(t, err)

	clk.add(61 * time.Second)
	_, err = sess.Append(f.ctx, eventstore.ExactVersion(1), ev("x", 2))
	require.ErrorIs(t, err, eventstore.ErrSessionExpired)
	err = sess.SaveSnapshot(f.ctx, 1, eventstore.SnapshotData{Data: json.RawMessage(`{}`)})
	require.ErrorIs(t, err, eventstore.ErrSessionExpired)
	require.Equal(t, 1, f.count(t))

	require.NoError(t, sess.Renew(f.ctx))
	_, err = sess.Append(f.ctx, eventstore.ExactVersion(1), ev("x", 2))
	require.NoError(t, err)
	require.NoError(t, sess.Close(f.ctx))
	_, err = sess.Append(f.ctx, eventstore.ExactVersion(2), ev("x", 3))
	require.ErrorIs(t, err, eventstore.ErrSessionClosed)
}

// Only one session holds a key: a second Open waits for the open timeout and fails;
// appends outside the session are refused; after expiry another session takes the key
// over and the first one's appends fail with ErrSessionHeld while it holds it.
func TestSessionIsExclusive(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	f := setup(t, &eventstore.Config{Clock: clk.now, OpenTimeout: 50 * time.Millisecond, SessionTimeout: time.Minute})
	first, err := f.store.Open(f.ctx, f.stream, "k", nil)
	require.NoError(t, err)

	_, err = f.store.Open(f.ctx, f.stream, "k", nil)
	require.ErrorIs(t, err, eventstore.ErrOpenTimeout)
	require.ErrorIs(t, err, eventstore.ErrSessionHeld)
	_, err = f.store.Append(f.ctx, f.stream, "k", eventstore.AnyVersion, ev("x", 1))
	require.ErrorIs(t, err, eventstore.ErrSessionHeld)
	_, err = f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, key, data) VALUES ($1, 'k', '1')`, f.stream)
	require.ErrorIs(t, wrap(err), eventstore.ErrSessionHeld)
	// Other keys are not held.
	_, err = f.store.Append(f.ctx, f.stream, "other", eventstore.AnyVersion, ev("x", 1))
	require.NoError(t, err)

	clk.add(2 * time.Minute)
	second, err := f.store.Open(f.ctx, f.stream, "k", nil)
	require.NoError(t, err)
	_, err = first.Append(f.ctx, eventstore.AnyVersion, ev("x", 1))
	require.ErrorIs(t, err, eventstore.ErrSessionHeld)
	_, err = second.Append(f.ctx, eventstore.NoVersion, ev("x", 1))
	require.NoError(t, err)
	require.NoError(t, first.Close(f.ctx)) // no longer holds it: does not release second's hold
	_, err = f.store.Append(f.ctx, f.stream, "k", eventstore.AnyVersion, ev("x", 2))
	require.ErrorIs(t, err, eventstore.ErrSessionHeld)
	require.NoError(t, second.Close(f.ctx))
	_, err = second.Append(f.ctx, eventstore.AnyVersion, ev("x", 2))
	require.ErrorIs(t, err, eventstore.ErrSessionClosed)
	// Closed: the key is free at once, to plain appends and to new sessions.
	_, err = f.store.Append(f.ctx, f.stream, "k", eventstore.ExactVersion(1), ev("x", 2))
	require.NoError(t, err)
	third, err := f.store.Open(f.ctx, f.stream, "k", nil)
	require.NoError(t, err)
	require.NoError(t, third.Close(f.ctx))
}

// An append in a session whose hold was released behind its back (here by SQL) fails
// with ErrNotOpen and writes nothing: the check is in SQL, not in the Session object.
// Renew fails the same way (nobody holds the key); it used to fail with
// ErrSessionHeld, which says another live session holds it.
func TestSessionNotOpen(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	stale, err := f.store.Open(f.ctx, f.stream, "k", &eventstore.OpenOpts{SessionID: "s-3"})
	require.NoError(t, err)
	_, err = f.pool.Exec(f.ctx, "SELECT streamd.close_key_session($1, 'k', 's-3')", f.stream)
	require.NoError(t, err)
	_, err = stale.Append(f.ctx, eventstore.AnyVersion, ev("x", 1))
	require.ErrorIs(t, err, eventstore.ErrNotOpen)
	require.Equal(t, 0, f.count(t))
	require.ErrorIs(t, stale.Renew(f.ctx), eventstore.ErrNotOpen)
	require.NoError(t, stale.Close(f.ctx))
}

// A waiting Open gets the key as soon as its holder closes.
func TestOpenWaitsForClose(t *testing.T) {
	t.Parallel()
	f := setup(t, &eventstore.Config{OpenTimeout: 20 * time.Second})
	first, err := f.store.Open(f.ctx, f.stream, "k", nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { // owner: this test; exits when Open returns
		s, err := f.store.Open(f.ctx, f.stream, "k", nil)
		if err == nil {
			_, err = s.Append(f.ctx, eventstore.NoVersion, ev("x", 1))
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("second Open returned while the key was held: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, first.Close(f.ctx))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("second Open did not get the key after Close")
	}
}

// Snapshots: Load returns the newest snapshot and only the events after it.
func TestSnapshotLoad(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	snap, events, err := f.store.Load(f.ctx, f.stream, "k")
	require.NoError(t, err)
	require.Nil(t, snap)
	require.Empty(t, events)
	for i := 1; i <= 5; i++ {
		_, err := f.store.Append(f.ctx, f.stream, "k", eventstore.ExactVersion(int64(i-1)), ev("x", i))
		require.NoError(t, err)
	}
	require.NoError(t, f.store.SaveSnapshot(f.ctx, f.stream, "k", 2, eventstore.SnapshotData{Data: json.RawMessage(`{"sum":3}`)}))
	require.NoError(t, f.store.SaveSnapshot(f.ctx, f.stream, "k", 4, eventstore.SnapshotData{Bytes: []byte("ten")}))
	snap, events, err = f.store.Load(f.ctx, f.stream, "k")
	require.NoError(t, err)
	require.NotNil(t, snap)
	require.Equal(t, int64(4), snap.Version)
	require.Equal(t, []byte("ten"), snap.Bytes)
	require.Len(t, events, 1)
	require.Equal(t, int64(5), events[0].KeyVersion)

	err = f.store.SaveSnapshot(f.ctx, f.stream, "k", 5, eventstore.SnapshotData{})
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
}

// With enforcement on, every append path accepts registered event types only.
func TestEventTypeRegistryEnforced(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	typ := "Registered-" + f.stream
	require.NoError(t, f.store.RegisterEventType(f.ctx, eventstore.EventType{Name: typ, Description: "a test type"}))
	err := f.store.RegisterEventType(f.ctx, eventstore.EventType{Name: "t-" + f.stream, ReferenceTable: "streamd.no_such_table"})
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	require.NoError(t, f.store.ConfigureStream(f.ctx, f.stream, eventstore.StreamOpts{KeyVersions: true, EnforceEventTypes: true}))

	_, err = f.store.Append(f.ctx, f.stream, "k", eventstore.AnyVersion, ev(typ, 1), ev("Unregistered", 2))
	require.ErrorIs(t, err, eventstore.ErrUnknownEventType)
	require.ErrorContains(t, err, "Unregistered")
	_, err = f.client.Produce(f.ctx, streams.Record{Stream: f.stream, EventType: "Unregistered", Data: json.RawMessage(`1`)})
	require.ErrorIs(t, err, eventstore.ErrUnknownEventType)
	_, err = f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, event_type, data) VALUES ($1, 'Unregistered', '1')`, f.stream)
	require.ErrorIs(t, wrap(err), eventstore.ErrUnknownEventType)
	require.Equal(t, 0, f.count(t))

	_, err = f.store.Append(f.ctx, f.stream, "k", eventstore.AnyVersion, ev(typ, 1))
	require.NoError(t, err)
	_, err = f.client.Produce(f.ctx, streams.Record{Stream: f.stream, EventType: typ, Data: json.RawMessage(`1`)})
	require.NoError(t, err)
	types, err := f.store.EventTypes(f.ctx)
	require.NoError(t, err)
	var found bool
	for _, et := range types {
		found = found || (et.Name == typ && et.Description == "a test type")
	}
	require.True(t, found)
	ok, err := f.store.DeleteEventType(f.ctx, typ)
	require.NoError(t, err)
	require.True(t, ok)
}

// TestRenewAfterATakeoverFails: a session that expired and was taken over cannot
// renew: it lost its exclusive hold in between. While the taker holds the key that is
// ErrSessionHeld; once the taker has closed, nobody holds the key and it is ErrNotOpen
// (as for an append in the session). Renew used to take the key back silently.
func TestRenewAfterATakeoverFails(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	f := setup(t, &eventstore.Config{Clock: clk.now, SessionTimeout: time.Minute})
	a, err := f.store.Open(f.ctx, f.stream, "k", nil)
	require.NoError(t, err)
	clk.add(2 * time.Minute)
	b, err := f.store.Open(f.ctx, f.stream, "k", nil)
	require.NoError(t, err)
	_, err = b.Append(f.ctx, eventstore.NoVersion, ev("x", 1))
	require.NoError(t, err)
	require.ErrorIs(t, a.Renew(f.ctx), eventstore.ErrSessionHeld)
	require.NoError(t, b.Close(f.ctx))
	require.ErrorIs(t, a.Renew(f.ctx), eventstore.ErrNotOpen)
	_, err = a.Append(f.ctx, eventstore.ExactVersion(1), ev("x", 2))
	require.ErrorIs(t, err, eventstore.ErrNotOpen)
	require.NoError(t, a.Close(f.ctx))
}

// TestCloseWithAnEndedContextReleases: a deferred Close with a cancelled ctx still
// frees the key (it used to fail and leave the key held until expiry, and a second
// Close did nothing).
func TestCloseWithAnEndedContextReleases(t *testing.T) {
	t.Parallel()
	f := setup(t, &eventstore.Config{SessionTimeout: time.Hour, OpenTimeout: 50 * time.Millisecond})
	sess, err := f.store.Open(f.ctx, f.stream, "k", nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(f.ctx)
	cancel()
	require.NoError(t, sess.Close(ctx))
	other, err := f.store.Open(f.ctx, f.stream, "k", nil)
	require.NoError(t, err, "the key is free")
	require.NoError(t, other.Close(f.ctx))
}

// TestAppendOutsideASessionEndsItsExpiredHold: once a session has expired, an append
// outside any session passes (the key is free to write) and ends the expired hold in
// the same statement, on every append path; the session can then neither renew nor
// append (ErrNotOpen), as it lost exclusive access in between. It used to renew and
// go on as if it had held the key throughout. The clock starts an hour in the past,
// so that the paths without an injected time (the producer, a plain INSERT: the
// database's clock) see the session expired too.
func TestAppendOutsideASessionEndsItsExpiredHold(t *testing.T) {
	t.Parallel()
	paths := []struct {
		name   string
		append func(f *fixture) error
	}{
		{"Store.Append", func(f *fixture) error {
			_, err := f.store.Append(f.ctx, f.stream, "k", eventstore.AnyVersion, ev("outsider", 2))
			return err
		}},
		{"producer (streamd.append)", func(f *fixture) error {
			_, err := f.client.Produce(f.ctx, streams.Record{Stream: f.stream, Key: "k", Data: json.RawMessage(`2`)})
			return err
		}},
		{"plain INSERT", func(f *fixture) error {
			_, err := f.pool.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, key, data) VALUES ($1, 'k', '2')`, f.stream)
			return wrap(err)
		}},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			clk := &clock{t: time.Now().Add(-time.Hour)}
			f := setup(t, &eventstore.Config{Clock: clk.now, SessionTimeout: time.Minute})
			a, err := f.store.Open(f.ctx, f.stream, "k", nil)
			require.NoError(t, err)
			_, err = a.Append(f.ctx, eventstore.NoVersion, ev("x", 1))
			require.NoError(t, err)
			clk.add(2 * time.Minute)

			require.NoError(t, p.append(f), "an expired session does not hold the key")
			require.ErrorIs(t, a.Renew(f.ctx), eventstore.ErrNotOpen)
			_, err = a.Append(f.ctx, eventstore.ExactVersion(2), ev("x", 3))
			require.ErrorIs(t, err, eventstore.ErrNotOpen)
			require.Equal(t, 2, f.count(t))
			// The key is free: a new session takes it at once.
			b, err := f.store.Open(f.ctx, f.stream, "k", &eventstore.OpenOpts{OpenTimeout: time.Millisecond})
			require.NoError(t, err)
			require.NoError(t, b.Close(f.ctx))
			require.NoError(t, a.Close(f.ctx))
		})
	}
}

// TestAFailedAppendOutsideASessionKeepsTheExpiredHold: an append outside any session
// that fails (here its expected version) writes nothing, so the expired session lost
// nothing and still renews.
func TestAFailedAppendOutsideASessionKeepsTheExpiredHold(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	f := setup(t, &eventstore.Config{Clock: clk.now, SessionTimeout: time.Minute})
	a, err := f.store.Open(f.ctx, f.stream, "k", nil)
	require.NoError(t, err)
	clk.add(2 * time.Minute)
	_, err = f.store.Append(f.ctx, f.stream, "k", eventstore.ExactVersion(5), ev("outsider", 1))
	require.ErrorIs(t, err, eventstore.ErrVersionMismatch)
	require.NoError(t, a.Renew(f.ctx))
	_, err = a.Append(f.ctx, eventstore.NoVersion, ev("x", 1))
	require.NoError(t, err)
	require.NoError(t, a.Close(f.ctx))
}

// TestOpenDoesNotWaitPastItsTimeoutForAnAppendInFlight: Open on a key that an AppendTx
// in an uncommitted transaction has locked fails with ErrOpenTimeout after its open
// timeout. It used to wait for the key head's row lock until that transaction ended;
// here it would have waited until the test rolled back after 10 s.
func TestOpenDoesNotWaitPastItsTimeoutForAnAppendInFlight(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for _, key := range []string{"new-key", "old-key"} { // the head row inserted, or updated, in flight
		if key == "old-key" {
			_, err := f.store.Append(f.ctx, f.stream, key, eventstore.NoVersion, ev("x", 1))
			require.NoError(t, err)
		}
		tx, err := f.pool.Begin(f.ctx)
		require.NoError(t, err)
		_, err = f.store.AppendTx(f.ctx, tx, f.stream, key, eventstore.AnyVersion, ev("x", 2))
		require.NoError(t, err)

		done := make(chan error, 1)
		start := time.Now()
		go func() { // owner: this test; exits when Open returns (at the latest once tx ends)
			_, err := f.store.Open(f.ctx, f.stream, key, &eventstore.OpenOpts{OpenTimeout: 200 * time.Millisecond})
			done <- err
		}()
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			require.NoError(t, tx.Rollback(f.ctx))
			t.Fatalf("%s: Open waited past its open timeout for the append in flight", key)
		}
		require.ErrorIs(t, err, eventstore.ErrOpenTimeout, key)
		require.Less(t, time.Since(start), 5*time.Second, key)
		require.NoError(t, tx.Commit(f.ctx))
		// Once the append committed, Open takes the key.
		s, err := f.store.Open(f.ctx, f.stream, key, nil)
		require.NoError(t, err)
		require.NoError(t, s.Close(f.ctx))
	}
	// open_key_session puts the caller's lock_timeout back.
	tx, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(f.ctx) }()
	var lt string
	require.NoError(t, tx.QueryRow(f.ctx, `SELECT set_config('lock_timeout', '7s', true)`).Scan(&lt))
	_, err = tx.Exec(f.ctx, "SELECT streamd.open_key_session($1, 'k', 's-lt', '1 minute', NULL, '50 ms')", f.stream)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(f.ctx, "SHOW lock_timeout").Scan(&lt))
	require.Equal(t, "7s", lt)
}
