package eventstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// errRollback ends a pgx.BeginFunc whose writes the test undoes.
var errRollback = errors.New("rollback")

// TestTenantHeadRowsMoveOnlyThroughAppends: a role bound to a tenant appends by every
// path (plain INSERT, streamd.append with a retried id, the Go client's small and large
// batches, a stream with key versions) without any write privilege on the shared head
// rows: the appends move them through streamd.head_reserve and its siblings (SECURITY
// DEFINER). Its own UPDATE, DELETE, INSERT or row lock of a head row is refused with
// 42501, and the definer functions cannot move a head back over offsets its
// transaction did not reserve or over a stored event (SD005); nor does the trusted
// mark let it write an event outside its own reservation. Offsets stay gapless.
// Before migration 0087 the role held UPDATE on stream_partitions and rewound the head.
func TestTenantHeadRowsMoveOnlyThroughAppends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, stream, acme, globex := tenantStream(t, "theads", 1)
	versioned := testdb.Name("theads-kv")
	_, err := admin.Exec(ctx, "SELECT streamd.create_stream($1, 1)", versioned)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "SELECT streamd.set_stream_event_sourcing($1, true, false)", versioned)
	require.NoError(t, err)

	// Every append path, as the tenant roles.
	_, err = acme.Exec(ctx, `INSERT INTO streamd.events (stream_name, data) VALUES ($1, '1')`, stream)
	require.NoError(t, err)
	_, err = globex.Exec(ctx, `INSERT INTO streamd.events (stream_name, data) VALUES ($1, '1')`, stream)
	require.NoError(t, err)
	_, err = acme.Exec(ctx, `SELECT * FROM streamd.append($1, NULL, ARRAY['a-1','a-2'], NULL, NULL, ARRAY['2','2'], NULL, NULL, NULL, NULL, NULL)`, stream)
	require.NoError(t, err)
	// A retry with one id stored: its offset is given back (head_give_back).
	rows, err := acme.Query(ctx, `SELECT duplicate FROM streamd.append($1, NULL, ARRAY['a-2','a-3'], NULL, NULL, ARRAY['3','3'], NULL, NULL, NULL, NULL, NULL) ORDER BY ord`, stream)
	require.NoError(t, err)
	dup, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	require.NoError(t, err)
	require.Equal(t, []bool{true, false}, dup)
	pool, err := pgxpool.New(ctx, acme.Config().ConnString())
	require.NoError(t, err)
	defer pool.Close()
	client := streams.NewClient(pool, nil)
	// 1: the one-statement path's form for one record (oneSQL); 3: the
	// one-statement path (insertSQL: head_reserve and an INSERT); 300: over the COPY
	// threshold, which a role under row-level security leaves for streamd.append.
	for _, n := range []int{1, 3, 300} {
		recs := make([]streams.Record, n)
		for i := range recs {
			recs[i] = streams.Record{Stream: stream, Partition: streams.PartitionOf(0), Data: []byte(`{}`)}
		}
		_, err = client.Produce(ctx, recs...)
		require.NoError(t, err, n)
	}
	_, err = acme.Exec(ctx, `SELECT * FROM streamd.append($1, NULL, NULL, NULL, ARRAY['k','k'], ARRAY['1','2'], NULL, NULL, NULL, NULL, NULL)`, versioned)
	require.NoError(t, err)
	_, err = acme.Exec(ctx, `INSERT INTO streamd.events (stream_name, key, data) VALUES ($1, 'k', '3')`, versioned)
	require.NoError(t, err)

	offs, next := logOffsets(t, admin, stream)
	require.Len(t, offs, 2+2+1+1+3+300)
	for i, o := range offs {
		require.Equal(t, int64(i), o)
	}
	require.Equal(t, int64(len(offs)), next)
	var lastVersion int64
	require.NoError(t, admin.QueryRow(ctx, `SELECT max(key_version) FROM streamd.events WHERE stream_name = $1`, versioned).Scan(&lastVersion))
	require.Equal(t, int64(3), lastVersion)

	// Direct writes of a head row are refused.
	for _, stmt := range []string{
		`UPDATE streamd.stream_partitions SET next_offset = 0 WHERE stream_name = $1`,
		`UPDATE streamd.stream_partitions SET log_start_offset = 50 WHERE stream_name = $1`,
		`DELETE FROM streamd.stream_partitions WHERE stream_name = $1`,
		`INSERT INTO streamd.stream_partitions (stream_name, partition) VALUES ($1, 7)`,
		`SELECT 1 FROM streamd.stream_partitions WHERE stream_name = $1 FOR UPDATE`,
	} {
		_, err := acme.Exec(ctx, stmt, stream)
		require.Equal(t, "42501", pgCode(err), "%s: %v", stmt, err)
	}
	_, after := logOffsets(t, admin, stream)
	require.Equal(t, next, after)

	// The definer functions move a head back only over offsets the calling transaction
	// reserved and left unused.
	_, err = acme.Exec(ctx, `SELECT streamd.head_give_back($1, 0, 0)`, stream)
	require.ErrorIs(t, wrap(err), streams.ErrInvalidArgument, "no reservation of its own: %v", err)
	require.ErrorIs(t, pgx.BeginFunc(ctx, acme, func(tx pgx.Tx) error {
		var base int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT base FROM streamd.head_reserve($1, 0, 2)`, stream).Scan(&base))
		require.Equal(t, next, base)
		_, err := tx.Exec(ctx, `SAVEPOINT s`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT streamd.head_give_back($1, 0, $2)`, stream, base-1)
		require.ErrorIs(t, wrap(err), streams.ErrInvalidArgument, "below its reservation: %v", err)
		_, err = tx.Exec(ctx, `ROLLBACK TO SAVEPOINT s`)
		require.NoError(t, err)
		// An event stored on a reserved offset cannot be given back either.
		_, err = tx.Exec(ctx, `INSERT INTO streamd.events (stream_name, data) VALUES ($1, '9')`, stream)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT streamd.head_give_back($1, 0, $2)`, stream, base)
		require.ErrorIs(t, wrap(err), streams.ErrInvalidArgument, "over a stored event: %v", err)
		return errRollback
	}), errRollback)
	_, after = logOffsets(t, admin, stream)
	require.Equal(t, next, after)

	// The trusted mark, which any inserting role can set, does not let a tenant write
	// at an offset of its choosing (past the head: every tenant's next append would
	// fail on it) nor rewrite its events.
	for name, stmt := range map[string]string{
		"insert past the head": `INSERT INTO streamd.events (stream_name, partition, "offset", data) VALUES ($1, 0, $2 + 5, '1')`,
		"rewrite an event":     `UPDATE streamd.events SET data = '{"forged": true}' WHERE stream_name = $1 AND "offset" = $2 - 1`,
	} {
		err := pgx.BeginFunc(ctx, acme, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('streamd.append_trusted', 'on', true)`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, stmt, stream, next)
			return err
		})
		require.ErrorIs(t, wrap(err), streams.ErrInvalidArgument, "%s: %v", name, err)
	}

	// Neither role may write the head rows; re-binding a role that was granted it
	// takes the grant away.
	var may bool
	for _, c := range []*pgx.Conn{acme, globex} {
		require.NoError(t, c.QueryRow(ctx, `SELECT has_table_privilege('streamd.stream_partitions', 'UPDATE')
			OR has_table_privilege('streamd.stream_partitions', 'INSERT') OR has_table_privilege('streamd.stream_partitions', 'DELETE')`).Scan(&may))
		require.False(t, may)
	}
	role := acme.Config().User
	require.NoError(t, pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('streamd.tenant_roles'))")
		if err == nil {
			_, err = tx.Exec(ctx, "GRANT UPDATE ON streamd.stream_partitions TO "+pgx.Identifier{role}.Sanitize())
		}
		return err
	}))
	_, err = admin.Exec(ctx, "SELECT streamd.bind_tenant_role($1, $2)", role, "acme-"+stream)
	require.NoError(t, err)
	require.NoError(t, admin.QueryRow(ctx, `SELECT has_table_privilege($1, 'streamd.stream_partitions', 'UPDATE')`, role).Scan(&may))
	require.False(t, may)
}

// TestTenantAdvisoriesAreTheTenants: an advisory reported by a tenant role's operation
// is appended to the shared advisory stream through the same head-row functions, is
// stamped with the tenant, and is invisible and unchangeable to another tenant.
func TestTenantAdvisoriesAreTheTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, stream, acme, globex := tenantStream(t, "tadvise", 1)
	key := stream + "/g"
	_, err := acme.Exec(ctx, `SELECT streamd.advise('streamd.group.offsets_reset', $1, jsonb_build_object('stream', $2::text))`, key, stream)
	require.NoError(t, err)
	count := func(c *pgx.Conn) int {
		var n int
		require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM streamd.events WHERE stream_name = 'streamd.advisories' AND key = $1`, key).Scan(&n))
		return n
	}
	require.Equal(t, 1, count(acme))
	require.Equal(t, 0, count(globex))
	tag, err := globex.Exec(ctx, `UPDATE streamd.events SET data = '{}' WHERE stream_name = 'streamd.advisories' AND key = $1`, key)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected())
	_, err = globex.Exec(ctx, `DELETE FROM streamd.events WHERE stream_name = 'streamd.advisories' AND key = $1`, key)
	require.Equal(t, "42501", pgCode(err), "%v", err)
	var tenant string
	require.NoError(t, admin.QueryRow(ctx, `SELECT tenant_id FROM streamd.events WHERE stream_name = 'streamd.advisories' AND key = $1`, key).Scan(&tenant))
	require.Equal(t, "acme-"+stream, tenant)
}
