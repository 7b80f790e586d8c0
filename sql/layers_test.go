package schema_test

import (
	"context"
	"io/fs"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
)

// withFile returns the embedded files plus (or with) one file at name.
func withFile(t *testing.T, name, text string) fs.FS {
	t.Helper()
	m := fstest.MapFS{}
	require.NoError(t, fs.WalkDir(schema.Files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(schema.Files, p)
		m[p] = &fstest.MapFile{Data: b}
		return err
	}))
	m[name] = &fstest.MapFile{Data: []byte(text)}
	return m
}

// TestMigrateFailureNamesTheFile: a function file or a migration that fails is named
// in the error (it used to say "apply functions and views"), and nothing of the run
// is applied.
func TestMigrateFailureNamesTheFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.FreshDatabase(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, tc := range []struct{ file, text string }{
		{"functions/0999_broken.sql", "CREATE OR REPLACE FUNCTION streamd.broken( RETURNS void"},
		{"views/0999_broken.sql", "CREATE OR REPLACE VIEW streamd.broken AS SELECT nothing FROM nowhere"},
		{"migrations/9998_broken.sql", "ALTER TABLE streamd.no_such_table ADD COLUMN x int"},
	} {
		_, err := schema.MigrateFS(ctx, conn, withFile(t, tc.file, tc.text))
		require.ErrorContains(t, err, "apply "+tc.file+":")
		var exists bool
		require.NoError(t, conn.QueryRow(ctx, "SELECT to_regclass('streamd.events') IS NOT NULL").Scan(&exists))
		require.False(t, exists, "%s: nothing applied", tc.file)
	}
}

// functions returns the identities (name and argument types) of the functions in the
// streamd schema.
func functions(t *testing.T, ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) map[string]bool {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'streamd'
		  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out
}

// forgotten returns the functions of have that want lacks.
func forgotten(have, want map[string]bool) []string {
	var out []string
	for f := range have {
		if !want[f] {
			out = append(out, f)
		}
	}
	return out
}

// TestNoForgottenFunctions: the test database (migrated by every version of the
// files it met, as a long-lived database is) holds no streamd function that the files
// do not define, as a new database made from them shows: a function whose signature
// changed without a DROP in a migration stays beside the new one and fails this. The
// check is shown to find such a function first.
func TestNoForgottenFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.FreshDatabase(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)
	want := functions(t, ctx, conn)
	require.Contains(t, want, "queue_set(p_queue text, p_fifo boolean, p_visibility_timeout_ms bigint, p_max_delivery_attempts integer, p_set_dead_letter_queue boolean, p_dead_letter_queue text, p_max_payload_bytes integer)")

	// The check finds a left-over signature.
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "CREATE FUNCTION streamd.queue_set(p_queue text) RETURNS void LANGUAGE sql AS ''")
	require.NoError(t, err)
	require.Equal(t, []string{"queue_set(p_queue text)"}, forgotten(functions(t, ctx, tx), want))
	require.NoError(t, tx.Rollback(ctx))

	require.Empty(t, forgotten(functions(t, ctx, testdb.Pool(t)), want),
		"functions no file defines: a signature change needs a DROP in a migration (sql/doc.go)")
}
