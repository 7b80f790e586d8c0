package eventstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/eventstore"
	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
	"github.com/streamd/streamd/streams"
)

// tenantStream creates a stream of the given partitions and two tenant roles, acme and
// globex, and returns the owner's connection, the stream and the two roles'
// connections (as tenantQueue does for a queue).
func tenantStream(t *testing.T, prefix string, partitions int) (admin *pgx.Conn, stream string, acme, globex *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	stream = testdb.Name(prefix)
	_, err = admin.Exec(ctx, "SELECT streamd.create_stream($1, $2)", stream, partitions)
	require.NoError(t, err)
	acme = tenantRole(t, admin, "acme-"+stream)
	globex = tenantRole(t, admin, "globex-"+stream)
	return admin, stream, acme, globex
}

// TestTenantAppendRefusesOtherTenantsEventID: event ids are unique per stream across
// the tenants that share it. A tenant's append of an event id that another tenant's
// event holds is refused with ErrInvalidArgument, naming the id, and stores nothing of
// the batch, through streamd.append and through the producer; the event was dropped
// without a position and the producer failed with an untyped count mismatch after the
// rest of the batch had committed. A tenant's own retry is still a duplicate.
func TestTenantAppendRefusesOtherTenantsEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, stream, acme, globex := tenantStream(t, "tenant-ids", 2)
	_, err := acme.Exec(ctx, `SELECT * FROM streamd.append($1, NULL, ARRAY['ev-1','ev-2'], NULL, ARRAY['k','k'], ARRAY['1','2'], NULL, NULL, NULL, NULL, NULL)`, stream)
	require.NoError(t, err)
	count := func() int {
		var n int
		require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM streamd.events WHERE stream_name = $1", stream).Scan(&n))
		return n
	}

	// streamd.append
	_, err = globex.Exec(ctx, `SELECT * FROM streamd.append($1, NULL, ARRAY['ev-3','ev-1'], NULL, ARRAY['k','k'], ARRAY['9','9'], NULL, NULL, NULL, NULL, NULL)`, stream)
	require.Equal(t, "SD005", pgCode(err), "%v", err)
	require.ErrorContains(t, err, "ev-1")
	require.Equal(t, 2, count(), "nothing of globex's batch is stored")
	// A plain INSERT is refused the same way (TestTenantInsertRefusesOtherTenantsEventID).
	_, err = globex.Exec(ctx, `INSERT INTO streamd.events (stream_name, partition, event_id, data) VALUES ($1, 0, 'ev-1', '9')`, stream)
	require.Equal(t, "SD005", pgCode(err), "%v", err)

	// The producer
	pool, err := pgxpool.New(ctx, globex.Config().ConnString())
	require.NoError(t, err)
	defer pool.Close()
	client := streams.NewClient(pool, nil)
	p0 := streams.PartitionOf(0)
	_, err = client.Produce(ctx,
		streams.Record{Stream: stream, Partition: p0, EventID: "ev-3", Data: []byte(`9`)},
		streams.Record{Stream: stream, Partition: p0, EventID: "ev-2", Data: []byte(`9`)})
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	require.ErrorContains(t, err, "ev-2")
	require.Equal(t, 2, count(), "nothing of globex's batch is stored")

	// globex's own event ids still deduplicate.
	first, err := client.Produce(ctx, streams.Record{Stream: stream, Partition: p0, EventID: "ev-3", Data: []byte(`9`)})
	require.NoError(t, err)
	again, err := client.Produce(ctx,
		streams.Record{Stream: stream, Partition: p0, EventID: "ev-3", Data: []byte(`9`)},
		streams.Record{Stream: stream, Partition: p0, EventID: "ev-4", Data: []byte(`9`)})
	require.NoError(t, err)
	require.True(t, again[0].Duplicate)
	require.Equal(t, first[0].Offset, again[0].Offset)
	require.False(t, again[1].Duplicate)
	require.Equal(t, 4, count())
}

// logOffsets returns the offsets of stream's events in partition 0 as the owner sees
// them (every tenant's), and the partition's next offset.
func logOffsets(t *testing.T, admin *pgx.Conn, stream string) ([]int64, int64) {
	t.Helper()
	ctx := context.Background()
	rows, err := admin.Query(ctx, `SELECT "offset" FROM streamd.events WHERE stream_name = $1 AND partition = 0 ORDER BY 1`, stream)
	require.NoError(t, err)
	offs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	var next int64
	require.NoError(t, admin.QueryRow(ctx, `SELECT next_offset FROM streamd.stream_partitions WHERE stream_name = $1 AND partition = 0`, stream).Scan(&next))
	return offs, next
}

// TestTenantInsertOnConflictRefusesOtherTenantsEventID: a tenant's plain INSERT ... ON
// CONFLICT DO NOTHING of an event id that another tenant's event holds is refused with
// SD005 (streams.ErrInvalidArgument), as streamd.append refuses it, and leaves the
// shared partition's offsets gapless. The offset trigger, which reads the events under
// row-level security, took an offset for the row and the unique index then dropped
// it: a permanent hole any tenant could make at will (L1), and the tenant was told
// nothing although its event was not stored.
func TestTenantInsertOnConflictRefusesOtherTenantsEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, stream, acme, globex := tenantStream(t, "tenant-oncf", 1)
	_, err := globex.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, 'x', '1')`, stream)
	require.NoError(t, err)

	_, err = acme.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, 'x', '2') ON CONFLICT DO NOTHING`, stream)
	require.ErrorIs(t, wrap(err), streams.ErrInvalidArgument, "%v", err)
	require.Equal(t, "SD005", pgCode(err))
	require.ErrorContains(t, err, `event id 'x' is already used on stream`)
	_, err = acme.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, 'y', '3')`, stream)
	require.NoError(t, err)

	offs, next := logOffsets(t, admin, stream)
	require.Equal(t, []int64{0, 1}, offs, "L1: no hole")
	require.Equal(t, int64(2), next)
}

// TestTenantInsertRefusesOtherTenantsEventID: a tenant's plain INSERT of an event id
// held by an event it cannot see (another tenant's, or one without a tenant) fails with
// SD005 naming the id, as streamd.append does (DESIGN.md, Tenants); it failed with a
// raw unique_violation (23505) from the index. Its own duplicate is still skipped.
func TestTenantInsertRefusesOtherTenantsEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, stream, acme, globex := tenantStream(t, "tenant-ins", 1)
	_, err := globex.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, 'x', '1')`, stream)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, 'no-tenant', '1')`, stream)
	require.NoError(t, err)

	for _, id := range []string{"x", "no-tenant"} {
		_, err = acme.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, $2, '2')`, stream, id)
		require.Equal(t, "SD005", pgCode(err), "%s: %v", id, err)
		require.ErrorIs(t, wrap(err), streams.ErrInvalidArgument)
		require.ErrorContains(t, err, "'"+id+"'")
	}
	tag, err := globex.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, 'x', '1')`, stream)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected(), "globex's own duplicate is skipped")

	offs, next := logOffsets(t, admin, stream)
	require.Equal(t, []int64{0, 1}, offs)
	require.Equal(t, int64(2), next)
}

// TestTenantInsertRefusesEventIDCommittedWhileWaiting: the offset trigger checks the
// event id again after waiting for the partition's head row, and there too an id that
// another tenant's insert committed meanwhile is refused (SD005) and the offset taken
// is undone with the statement. The trigger's check after the wait saw only the
// tenant's own events: it kept the offset, and ON CONFLICT DO NOTHING then dropped the
// row, leaving a hole.
func TestTenantInsertRefusesEventIDCommittedWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, stream, acme, globex := tenantStream(t, "tenant-wait", 1)

	tx, err := globex.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, 'x', '1')`, stream)
	require.NoError(t, err) // holds the head row of partition 0 until it commits

	done := make(chan error, 1)
	go func() {
		_, err := acme.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, 'x', '2')
			ON CONFLICT DO NOTHING -- acme waits`, stream)
		done <- err
	}()
	testdb.WaitForLockWait(t, testdb.Pool(t), tx, "-- acme waits") // for the head row
	require.NoError(t, tx.Commit(ctx))
	err = <-done
	require.Equal(t, "SD005", pgCode(err), "%v", err)
	require.ErrorContains(t, err, "'x'")

	_, err = acme.Exec(ctx, `INSERT INTO streamd.events (stream_name, event_id, data) VALUES ($1, 'y', '3')`, stream)
	require.NoError(t, err)
	offs, next := logOffsets(t, admin, stream)
	require.Equal(t, []int64{0, 1}, offs, "L1: no hole")
	require.Equal(t, int64(2), next)
}

// TestTenantVersionedAppendRefusesOtherTenantsEventID: on a stream with key versions
// (which streamd.append hands to streamd.append_versioned), a tenant's append of an
// event id that another tenant's event holds is refused with SD005
// (streams.ErrInvalidArgument) naming the id, through streamd.append and through
// Store.Append, and moves neither the key's version nor the offsets. The retry check
// read the events under row-level security, took the id for a new event, advanced the
// key head and failed on the unique index with a raw unique_violation (23505).
func TestTenantVersionedAppendRefusesOtherTenantsEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, stream, acme, globex := tenantStream(t, "tenant-ver", 1)
	owner, err := eventstore.New(testdb.Pool(t), nil)
	require.NoError(t, err)
	require.NoError(t, owner.ConfigureStream(ctx, stream, eventstore.StreamOpts{KeyVersions: true}))
	_, err = globex.Exec(ctx, `SELECT * FROM streamd.append($1, NULL, ARRAY['x'], NULL, ARRAY['k'], ARRAY['1'], NULL, NULL, NULL, NULL, NULL)`, stream)
	require.NoError(t, err)

	// streamd.append
	_, err = acme.Exec(ctx, `SELECT * FROM streamd.append($1, NULL, ARRAY['fresh','x'], NULL, ARRAY['k','k'], ARRAY['2','2'], NULL, NULL, NULL, NULL, NULL)`, stream)
	require.Equal(t, "SD005", pgCode(err), "%v", err)
	require.ErrorContains(t, err, `event id 'x' is already used on stream`)

	// Store.Append
	pool, err := pgxpool.New(ctx, acme.Config().ConnString())
	require.NoError(t, err)
	defer pool.Close()
	store, err := eventstore.New(pool, nil)
	require.NoError(t, err)
	for _, key := range []string{"k", "other"} {
		_, err = store.Append(ctx, stream, key, eventstore.AnyVersion,
			eventstore.Event{EventID: "fresh", Data: []byte(`2`)}, eventstore.Event{EventID: "x", Data: []byte(`2`)})
		require.ErrorIs(t, err, streams.ErrInvalidArgument, "key %s: %v", key, err)
		require.ErrorContains(t, err, "'x'")
	}

	for key, want := range map[string]int64{"k": 1, "other": 0} {
		v, err := owner.Version(ctx, stream, key)
		require.NoError(t, err)
		require.Equal(t, want, v, "key %s", key)
	}
	offs, next := logOffsets(t, admin, stream)
	require.Equal(t, []int64{0}, offs)
	require.Equal(t, int64(1), next)
}

// TestStoredEventIDsExecuteOnlyForBoundRoles: streamd.stored_event_ids, which tells
// whether an event id is used on a stream whoever's event holds it, is not PUBLIC:
// bind_tenant_role grants EXECUTE, unbind_tenant_role revokes it, and a migration that
// re-applies the functions grants it to roles bound before (the appends of a role bound
// without it would fail with "permission denied").
func TestStoredEventIDsExecuteOnlyForBoundRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fresh := testdb.FreshDatabase(t)
	conn, err := pgx.Connect(ctx, fresh)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)
	admin, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	bound, boundIdent := newRole(t, admin, "streamd_tenant")
	unbound, unboundIdent := newRole(t, admin, "streamd_unbound")
	t.Cleanup(func() { // before newRole's cleanup drops the roles
		c, err := pgx.Connect(ctx, fresh)
		if err == nil {
			_, _ = c.Exec(ctx, "DROP OWNED BY "+boundIdent+", "+unboundIdent)
			_ = c.Close(ctx)
		}
	})
	_, err = conn.Exec(ctx, "GRANT USAGE ON SCHEMA streamd TO "+unboundIdent)
	require.NoError(t, err)
	canExecute := func(role string) bool {
		var ok bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT has_function_privilege($1, 'streamd.stored_event_ids(text, text[])', 'EXECUTE')`, role).Scan(&ok))
		return ok
	}

	_, err = conn.Exec(ctx, "SELECT streamd.bind_tenant_role($1, 'acme')", bound)
	require.NoError(t, err)
	require.True(t, canExecute(bound))
	require.False(t, canExecute(unbound))

	// A role bound before the function existed: the next migration grants it.
	_, err = conn.Exec(ctx, "REVOKE EXECUTE ON FUNCTION streamd.stored_event_ids(text, text[]) FROM "+boundIdent)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "UPDATE streamd.schema_objects SET hash = 'older'")
	require.NoError(t, err)
	res, err := schema.MigrateConn(ctx, conn)
	require.NoError(t, err)
	require.True(t, res.ObjectsUpdated)
	require.True(t, canExecute(bound))
	require.False(t, canExecute(unbound))

	_, err = conn.Exec(ctx, "SELECT streamd.unbind_tenant_role($1)", bound)
	require.NoError(t, err)
	require.False(t, canExecute(bound))
}

// TestUnboundRoleAppendsWithoutStoredEventIDs: a role under row-level security but
// bound to no tenant sees every event, so its appends never ask
// streamd.stored_event_ids, which it may not execute: a plain INSERT (new id and
// duplicate) and streamd.append on a stream with key versions work as before.
func TestUnboundRoleAppendsWithoutStoredEventIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	stream := testdb.Name("unbound-app")
	_, err = admin.Exec(ctx, "SELECT streamd.create_stream($1, 1)", stream)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "SELECT streamd.set_stream_event_sourcing($1, true, false)", stream)
	require.NoError(t, err)
	acme := tenantRole(t, admin, "acme-"+stream)
	_, err = acme.Exec(ctx, `INSERT INTO streamd.events (stream_name, key, event_id, data) VALUES ($1, 'k', 'acme-1', '1')`, stream)
	require.NoError(t, err)

	role, ident := newRole(t, admin, "streamd_unbound")
	require.NoError(t, pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('streamd.tenant_roles'))"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "GRANT USAGE ON SCHEMA streamd TO "+ident+
			"; GRANT SELECT ON streamd.streams, streamd.event_types TO "+ident+
			"; GRANT SELECT ON streamd.stream_partitions TO "+ident+
			"; GRANT EXECUTE ON FUNCTION streamd.head_reserve(text, integer, integer), streamd.head_give_back(text, integer, bigint), streamd.head_lock(text, integer[]) TO "+ident+
			"; GRANT SELECT, INSERT, UPDATE ON streamd.events, streamd.key_heads TO "+ident)
		return err
	}))
	var canExecute bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT has_function_privilege($1, 'streamd.stored_event_ids(text, text[])', 'EXECUTE')`, role).Scan(&canExecute))
	require.False(t, canExecute)

	require.NoError(t, pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SET LOCAL ROLE "+ident)
		require.NoError(t, err)
		for id, rows := range map[string]int64{"u-1": 1, "acme-1": 0} {
			tag, err := tx.Exec(ctx, `INSERT INTO streamd.events (stream_name, key, event_id, data) VALUES ($1, 'k', $2, '2')`, stream, id)
			require.NoError(t, err, id)
			require.Equal(t, rows, tag.RowsAffected(), id)
		}
		rows, err := tx.Query(ctx, `SELECT duplicate FROM streamd.append($1, NULL, ARRAY['u-1','u-2'], NULL, ARRAY['k','k'], ARRAY['3','3'], NULL, NULL, NULL, NULL, NULL) ORDER BY ord`, stream)
		require.NoError(t, err)
		dup, err := pgx.CollectRows(rows, pgx.RowTo[bool])
		require.NoError(t, err)
		require.Equal(t, []bool{true, false}, dup)
		return nil
	}))
	offs, next := logOffsets(t, admin, stream)
	require.Equal(t, []int64{0, 1, 2}, offs)
	require.Equal(t, int64(3), next)
}
