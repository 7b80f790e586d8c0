package streams_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestOneStatementAppendKeepsAGenericPlan: on one connection, the one-statement path's
// statement settles on PostgreSQL's generic plan after the five custom plans a
// prepared statement starts with, for one record and for a hundred, instead of being
// planned again on every call: planning was a fifth of the server's CPU for a
// one-record append (issue 21 §2; bench/RESULTS.md). The statement's row estimates
// must not depend on its parameters (no generate_series($n), no function in FROM).
func TestOneStatementAppendKeepsAGenericPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := testdb.Config(t)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	c := streams.NewClient(pool, nil)
	s := testdb.Name("generic")
	require.NoError(t, c.CreateStream(ctx, s, 2))

	before := streams.InsertAppends()
	for _, n := range []int{1, 100} {
		for i := 0; i < 12; i++ {
			recs := make([]streams.Record, n)
			for j := range recs {
				recs[j] = streams.Record{Stream: s, Partition: streams.PartitionOf(int32(i % 2)), Data: json.RawMessage(`{"a":1}`)}
			}
			_, err := c.Produce(ctx, recs...)
			require.NoError(t, err)
		}
	}
	require.Equal(t, before+24, streams.InsertAppends(), "every batch took the one-statement path")
	var generic, custom int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
		streams.InsertSQL).Scan(&generic, &custom))
	require.LessOrEqual(t, custom, int64(5), "custom plans (generic %d)", generic)
	require.GreaterOrEqual(t, generic, int64(24-5), "generic plans (custom %d)", custom)
}
