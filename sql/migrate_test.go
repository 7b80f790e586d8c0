package schema_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
)

func TestMigrateFreshTwiceIsNoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.FreshDatabase(t))
	require.NoError(t, err)
	defer pool.Close()

	all, err := schema.Migrations()
	require.NoError(t, err)
	require.NotEmpty(t, all)

	first, err := schema.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Len(t, first.Applied, len(all))
	require.True(t, first.ObjectsUpdated)

	second, err := schema.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, second.Applied, "a second run applies nothing")
	require.False(t, second.ObjectsUpdated, "a second run re-creates nothing whose text is unchanged")

	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.schema_migrations").Scan(&n))
	require.Equal(t, len(all), n)
	// Everything lives in schema streamd.
	var outside int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public'`).Scan(&outside))
	require.Zero(t, outside)
}

func TestMigrateConcurrentRunsBothSucceed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.FreshDatabase(t)
	var g errgroup.Group
	results := make([]schema.Result, 4)
	for i := range results {
		g.Go(func() error {
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				return err
			}
			defer pool.Close()
			results[i], err = schema.Migrate(ctx, pool)
			return err
		})
	}
	require.NoError(t, g.Wait())
	all, err := schema.Migrations()
	require.NoError(t, err)
	applied := 0
	for _, r := range results {
		applied += len(r.Applied)
	}
	require.Equal(t, len(all), applied, "each migration applied exactly once across the concurrent runs")
}

// TestOlderBinaryKeepsNewerFunctions: a database migrated by a newer streamd (it holds
// a migration this binary does not know, and functions of another text) is left as it
// is: an older binary starting during a rolling upgrade or a rollback used to put its
// own, older function bodies back over the newer schema.
func TestOlderBinaryKeepsNewerFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.FreshDatabase(t))
	require.NoError(t, err)
	defer pool.Close()
	_, err = schema.Migrate(ctx, pool)
	require.NoError(t, err)
	// What a newer binary leaves: a migration past ours, and its own function texts.
	_, err = pool.Exec(ctx, `INSERT INTO streamd.schema_migrations (version, name) VALUES (9999, '9999_from_the_future.sql');
		UPDATE streamd.schema_objects SET hash = 'newer';
		CREATE OR REPLACE FUNCTION streamd.queue_dlq_ok(p_dlq text) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true $$`)
	require.NoError(t, err)
	res, err := schema.Migrate(ctx, pool)
	require.NoError(t, err)
	require.True(t, res.NewerSchema)
	require.False(t, res.ObjectsUpdated)
	var body string
	require.NoError(t, pool.QueryRow(ctx, `SELECT prosrc FROM pg_proc WHERE proname = 'queue_dlq_ok'`).Scan(&body))
	require.Contains(t, body, "SELECT true", "the newer function is kept")
}

// TestMigrateInAnOwnedSchemaWithoutCreateOnTheDatabase: a role that owns schema
// streamd (made for it by a DBA) but may not create schemas in the database migrates;
// CREATE SCHEMA IF NOT EXISTS refused it.
func TestMigrateInAnOwnedSchemaWithoutCreateOnTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.FreshDatabase(t)
	admin, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer admin.Close(ctx)
	role := strings.ReplaceAll(testdb.Name("streamd_app"), "-", "_")
	ident := pgx.Identifier{role}.Sanitize()
	var db string
	require.NoError(t, admin.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	_, err = admin.Exec(ctx, "CREATE ROLE "+ident+" LOGIN NOSUPERUSER; CREATE SCHEMA streamd AUTHORIZATION "+ident+
		"; REVOKE CREATE ON DATABASE "+pgx.Identifier{db}.Sanitize()+" FROM PUBLIC")
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, testdb.URL(t))
		if err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
			_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+ident)
			_ = c.Close(ctx)
		}
	})
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SET ROLE "+ident)
	require.NoError(t, err)
	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)
}

// TestMigrationsAndFunctionsCommitTogether: when the functions and views fail to
// apply, the migrations of the same run are not committed either (they used to be,
// leaving new tables under old, or no, function bodies).
func TestMigrationsAndFunctionsCommitTogether(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.FreshDatabase(t))
	require.NoError(t, err)
	defer pool.Close()
	// A table where a view goes makes the views fail after every migration applied.
	_, err = pool.Exec(ctx, "CREATE SCHEMA streamd; CREATE TABLE streamd.consumer_group_status (x int)")
	require.NoError(t, err)
	_, err = schema.Migrate(ctx, pool)
	require.Error(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.schema_migrations").Scan(&n))
	require.Zero(t, n, "no migration committed")
	var tables int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'streamd' AND tablename = 'events'").Scan(&tables))
	require.Zero(t, tables)
}
