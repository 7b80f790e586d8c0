package schema_test

import (
	"context"
	"testing"

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
