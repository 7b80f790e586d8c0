package eventstore_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// newRole creates a login role (no superuser, no BYPASSRLS; roles are cluster-wide,
// so the name is unique) and drops it, with its binding and grants, when the test
// ends. It returns the role's name and quoted identifier.
func newRole(t *testing.T, admin *pgx.Conn, prefix string) (role, ident string) {
	t.Helper()
	ctx := context.Background()
	role = strings.ReplaceAll(testdb.Name(prefix), "-", "_")
	ident = pgx.Identifier{role}.Sanitize()
	_, err := admin.Exec(ctx, "CREATE ROLE "+ident+" LOGIN NOSUPERUSER NOBYPASSRLS")
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, testdb.URL(t))
		if err == nil {
			// Revoking (DROP OWNED) changes the same catalog rows as another test's
			// GRANTs: take the lock streamd.bind_tenant_role takes.
			_ = pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				_, _ = tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('streamd.tenant_roles'))")
				_, _ = tx.Exec(ctx, "DELETE FROM streamd.tenant_roles WHERE role_name = $1", role)
				_, _ = tx.Exec(ctx, "DROP OWNED BY "+ident)
				_, err := tx.Exec(ctx, "DROP ROLE IF EXISTS "+ident)
				return err
			})
			_ = c.Close(ctx)
		}
	})
	return role, ident
}

// tenantRole creates a login role bound to tenant (newRole). It returns a connection
// as that role.
func tenantRole(t *testing.T, admin *pgx.Conn, tenant string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	role, _ := newRole(t, admin, "streamd_tenant")
	_, err := admin.Exec(ctx, "SELECT streamd.bind_tenant_role($1, $2)", role, tenant)
	require.NoError(t, err)
	base := testdb.URL(t)
	var connStr string
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		u, err := url.Parse(base)
		require.NoError(t, err)
		u.User = url.User(role)
		connStr = u.String()
	} else {
		connStr = base + " user=" + role
	}
	conn, err := pgx.Connect(ctx, connStr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if err != nil && asPg(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// A tenant role cannot read or write another tenant's rows, by plain SQL or through
// streamd.append, in events and in messages; its own rows are stamped with its tenant
// without naming it; the owner still sees everything.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	stream := testdb.Name("tenants")
	queue := testdb.Name("tenantq")
	_, err = admin.Exec(ctx, "SELECT streamd.create_stream($1, 2)", stream)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "SELECT streamd.queue_create($1, false, 30000, 5, NULL, 1048576)", queue)
	require.NoError(t, err)
	acme := tenantRole(t, admin, "acme-"+stream)
	globex := tenantRole(t, admin, "globex-"+stream)

	// Each tenant appends by plain INSERT and by streamd.append, naming no tenant.
	for _, c := range []*pgx.Conn{acme, globex} {
		_, err = c.Exec(ctx, `INSERT INTO streamd.events (stream_name, key, data) VALUES ($1, 'k', '1')`, stream)
		require.NoError(t, err)
		_, err = c.Exec(ctx, `SELECT * FROM streamd.append($1, NULL, NULL, NULL, ARRAY['k','j'], ARRAY['2','3'], NULL, NULL, NULL, NULL, NULL)`, stream)
		require.NoError(t, err)
		_, err = c.Exec(ctx, `SELECT * FROM streamd.queue_send($1, NULL, ARRAY['{}'], NULL, NULL, NULL, NULL, NULL, NULL, NULL)`, queue)
		require.NoError(t, err)
	}
	count := func(c *pgx.Conn, table, name, tenant string) int {
		var n int
		require.NoError(t, c.QueryRow(ctx, "SELECT count(*) FROM streamd."+table+" WHERE stream_name = $1 AND tenant_id IS NOT DISTINCT FROM $2", name, tenant).Scan(&n))
		return n
	}
	for _, tc := range []struct {
		conn        *pgx.Conn
		own, others string
	}{{acme, "acme-" + stream, "globex-" + stream}, {globex, "globex-" + stream, "acme-" + stream}} {
		require.Equal(t, 3, count(tc.conn, "events", stream, tc.own))
		require.Equal(t, 0, count(tc.conn, "events", stream, tc.others))
		require.Equal(t, 1, count(tc.conn, "messages", queue, tc.own))
		require.Equal(t, 0, count(tc.conn, "messages", queue, tc.others))
		// Fetch through the log's read path sees only its own rows too.
		res, err := streams.FetchTx(ctx, tc.conn, stream, 0, 0, nil)
		require.NoError(t, err)
		res1, err := streams.FetchTx(ctx, tc.conn, stream, 1, 0, nil)
		require.NoError(t, err)
		require.Len(t, append(res.Events, res1.Events...), 3)

		// Writing a row of the other tenant is refused, by either path.
		_, err = tc.conn.Exec(ctx, `INSERT INTO streamd.events (stream_name, key, data, tenant_id) VALUES ($1, 'k', '9', $2)`, stream, tc.others)
		require.Equal(t, "42501", pgCode(err), "%v", err)
		_, err = tc.conn.Exec(ctx, `INSERT INTO streamd.messages (stream_name, message_id, data, tenant_id) VALUES ($1, 'x', '{}', $2)`, queue, tc.others)
		require.Equal(t, "42501", pgCode(err), "%v", err)
		// Updating or deleting the other tenant's messages finds nothing to change.
		tag, err := tc.conn.Exec(ctx, `DELETE FROM streamd.messages WHERE stream_name = $1`, queue)
		require.NoError(t, err)
		require.Equal(t, int64(1), tag.RowsAffected()) // its own message only
	}
	// The owner bypasses the policies and sees both tenants' rows.
	require.Equal(t, 3, count(admin, "events", stream, "acme-"+stream))
	require.Equal(t, 3, count(admin, "events", stream, "globex-"+stream))
	require.Equal(t, 0, count(admin, "messages", queue, "acme-"+stream))
}

// A tenant's large batch through streams.Client cannot take the COPY fast path (COPY
// refuses tables under row-level security); it falls back to streamd.append, is stored
// once, gapless, and stamped with the tenant.
func TestTenantLargeBatchFallsBackFromCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	stream := testdb.Name("tenant-copy")
	_, err = admin.Exec(ctx, "SELECT streamd.create_stream($1, 1)", stream)
	require.NoError(t, err)
	tenant := "initech-" + stream
	conn := tenantRole(t, admin, tenant)
	pool, err := pgxpool.New(ctx, conn.Config().ConnString())
	require.NoError(t, err)
	defer pool.Close()

	recs := make([]streams.Record, 64)
	for i := range recs {
		recs[i] = streams.Record{Stream: stream, Partition: streams.PartitionOf(0), Data: []byte(`{}`)}
	}
	pos, err := streams.NewClient(pool, nil).Produce(ctx, recs...)
	require.NoError(t, err)
	for i, p := range pos {
		require.Equal(t, int64(i), p.Offset)
	}
	var n, tenants int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE tenant_id = $2)
		FROM streamd.events WHERE stream_name = $1`, stream, tenant).Scan(&n, &tenants))
	require.Equal(t, 64, n)
	require.Equal(t, 64, tenants)
}

// A stream with per-key versions cannot take the COPY fast path either: a large batch
// goes through streamd.append_versioned and its keyed events get versions.
func TestVersionedLargeBatchFallsBackFromCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := testdb.Name("versioned-copy")
	_, err := pool.Exec(ctx, "SELECT streamd.create_stream($1, 1)", stream)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE streamd.streams SET key_versions = true WHERE stream_name = $1", stream)
	require.NoError(t, err)
	recs := make([]streams.Record, 40)
	for i := range recs {
		recs[i] = streams.Record{Stream: stream, Partition: streams.PartitionOf(0), Key: "acct", Data: []byte(`{}`)}
	}
	_, err = streams.NewClient(pool, nil).Produce(ctx, recs...)
	require.NoError(t, err)
	var maxVersion int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(key_version) FROM streamd.events WHERE stream_name = $1", stream).Scan(&maxVersion))
	require.Equal(t, int64(40), maxVersion)
}

// TestUnboundRoleReadsEvents: a role bound to no tenant, granted SELECT on the log,
// reads it (the policies let it pass); it failed with "permission denied for table
// tenant_roles", which the policies read with the caller's rights.
func TestUnboundRoleReadsEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	stream := testdb.Name("unbound")
	_, err = admin.Exec(ctx, "SELECT streamd.create_stream($1, 1)", stream)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "INSERT INTO streamd.events (stream_name, data) VALUES ($1, '1')", stream)
	require.NoError(t, err)

	_, ident := newRole(t, admin, "streamd_reader")
	require.NoError(t, pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('streamd.tenant_roles'))"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "GRANT USAGE ON SCHEMA streamd TO "+ident+"; GRANT SELECT ON streamd.events TO "+ident)
		return err
	}))
	var n int
	require.NoError(t, pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+ident); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT count(*) FROM streamd.events WHERE stream_name = $1", stream).Scan(&n)
	}))
	require.Equal(t, 1, n)
}

// TestBindRefusesRolesThatBypassRowSecurity: row-level security does not apply to a
// BYPASSRLS role, a superuser, or a member of the streamd tables' owner; binding one
// used to succeed and look isolated while the role read every tenant. It is SD005 now,
// and nothing is recorded.
func TestBindRefusesRolesThatBypassRowSecurity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	defer admin.Close(ctx)
	var owner string
	require.NoError(t, admin.QueryRow(ctx, "SELECT relowner::regrole::text FROM pg_class WHERE oid = 'streamd.events'::regclass").Scan(&owner))
	for name, alter := range map[string]string{
		"bypassrls":       "ALTER ROLE %s BYPASSRLS",
		"superuser":       "ALTER ROLE %s SUPERUSER",
		"member of owner": "GRANT " + owner + " TO %s",
	} {
		t.Run(name, func(t *testing.T) {
			role, ident := newRole(t, admin, "streamd_bypass")
			require.NoError(t, pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('streamd.tenant_roles'))")
				if err == nil {
					_, err = tx.Exec(ctx, fmt.Sprintf(alter, ident))
				}
				return err
			}))
			_, err := admin.Exec(ctx, "SELECT streamd.bind_tenant_role($1, 'acme')", role)
			require.ErrorIs(t, sqlerr.Wrap(err), streams.ErrInvalidArgument)
			require.ErrorContains(t, err, "bypasses row-level security")
			var bound bool
			require.NoError(t, admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM streamd.tenant_roles WHERE role_name = $1)", role).Scan(&bound))
			require.False(t, bound)
		})
	}
}
