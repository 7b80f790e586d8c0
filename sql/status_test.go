package schema_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
)

// TestCheckSaysWhatTheSchemaLacks: Check is ErrNotMigrated on an empty database, nil
// once migrated, and ErrSchemaBehind naming both migrations when the database lacks
// the latest.
func TestCheckSaysWhatTheSchemaLacks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.FreshDatabase(t))
	require.NoError(t, err)
	defer pool.Close()

	require.ErrorIs(t, schema.Check(ctx, pool), schema.ErrNotMigrated)
	_, err = schema.Migrate(ctx, pool)
	require.NoError(t, err)
	require.NoError(t, schema.Check(ctx, pool))

	all, err := schema.Migrations()
	require.NoError(t, err)
	latest := all[len(all)-1].Version
	_, err = pool.Exec(ctx, "DELETE FROM streamd.schema_migrations WHERE version = $1", latest)
	require.NoError(t, err)
	err = schema.Check(ctx, pool)
	require.ErrorIs(t, err, schema.ErrSchemaBehind)
	require.ErrorContains(t, err, "needs")
}
