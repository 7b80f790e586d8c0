package bench

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestGrowthPlan(t *testing.T) {
	t.Parallel()
	sizes := []int64{0, 10_000_000, 50_000_000}
	for _, tc := range []struct {
		kept int64
		temp []bool
	}{
		{0, []bool{false, false, false}},         // first run: every size grows the kept ballast
		{1_000_000, []bool{true, false, false}},  // after a quick run: 0 in the temporary database
		{10_000_000, []bool{true, false, false}}, // 10M reused, then grown to 50M
		{10_000_004, []bool{true, true, false}},  // just above a size: that size goes to the temporary one
		{50_000_000, []bool{true, true, false}},  // after a full run: 0 and 10M loaded in the temporary one
		{60_000_000, []bool{true, true, true}},   // a ballast is never shrunk
		{4, []bool{true, false, false}},          // any ballast at all sends 0 elsewhere
	} {
		plan := growthPlan(tc.kept, sizes)
		require.Len(t, plan, len(sizes))
		for i, st := range plan {
			require.Equal(t, sizes[i], st.events)
			require.Equal(t, tc.temp[i], st.temp, "kept %d, size %d", tc.kept, sizes[i])
		}
	}
}

// TestGrowthScenario runs the growth scenario at the tiny size: every log size has its
// produce and fetch pairs with ratios, the kept ballast ends at the largest size (or
// above) with head rows that match its rows on both tables, and no temporary database
// is left behind.
func TestGrowthScenario(t *testing.T) {
	t.Parallel()
	env := tinyEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := growthScenario{}.Run(ctx, env)
	require.NoError(t, err)
	sizes := env.Suite.GrowthLogEvents
	bySystem := map[string]int{}
	for _, r := range res {
		bySystem[r.System]++
		require.Positive(t, r.Records, r.Case)
		require.NotNil(t, r.Latency, r.Case)
		require.Contains(t, sizes, r.Params.LogEvents, r.Case)
		require.Contains(t, r.Case, "log="+countLabel(int(r.Params.LogEvents)), r.Case)
		if !r.Baseline && r.RatioTo != "" {
			require.Positive(t, r.Ratio, r.Case)
			require.Equal(t, r.Params.LogEvents, find(res, r.RatioTo).Params.LogEvents, r.Case)
		}
		t.Logf("%-56s %9.0f rec/s  ratio %.2f", r.Case, r.RecordsPerSec, r.Ratio)
	}
	for _, sys := range []string{"produce-streamd", "produce-copy", "fetch-streamd", "fetch-raw-select"} {
		require.Equal(t, len(sizes), bySystem[sys], sys)
	}
	require.Equal(t, bySystem["load-streamd"] > 0, bySystem["load-copy"] > 0)
	require.Len(t, env.Notes, 1)
	t.Log(env.Notes[0].Text)

	base := env.Pool.Config().ConnConfig.Database
	var temps int
	require.NoError(t, env.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1",
		tempDBPrefix(base)+env.RunID).Scan(&temps))
	require.Zero(t, temps, "temporary database dropped")

	cfg := env.Pool.Config().Copy()
	cfg.ConnConfig.Database = ballastDBName(base)
	cfg.MaxConns = 1
	kept, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer kept.Close()
	// Rows and head rows agree, partition by partition, and the baseline table holds
	// as many rows: under the ballast's lock, as another run may be growing it.
	conn, err := kept.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", ballastLockKey)
	require.NoError(t, err)
	defer func() {
		_, _ = conn.Exec(context.Background(), "SELECT pg_advisory_unlock(hashtext($1))", ballastLockKey)
	}()
	rows, err := conn.Query(ctx, `SELECT h.partition, h.next_offset, h.log_start_offset,
			(SELECT count(*) FROM streamd.events e WHERE e.stream_name = h.stream_name AND e.partition = h.partition),
			(SELECT coalesce(max("offset") + 1, 0) FROM streamd.events e WHERE e.stream_name = h.stream_name AND e.partition = h.partition),
			(SELECT count(*) FROM streamd_bench.growth_copy c WHERE c.stream_name = h.stream_name AND c.partition = h.partition)
		FROM streamd.stream_partitions h WHERE h.stream_name = $1 ORDER BY h.partition`, ballastStream)
	require.NoError(t, err)
	defer rows.Close()
	parts := 0
	for rows.Next() {
		var p int32
		var next, start, count, end, copies int64
		require.NoError(t, rows.Scan(&p, &next, &start, &count, &end, &copies))
		require.Zero(t, start)
		require.Equal(t, next, count, "partition %d", p)
		require.Equal(t, next, end, "partition %d", p)
		require.Equal(t, next, copies, "partition %d", p)
		require.GreaterOrEqual(t, next, sizes[len(sizes)-1]/ballastPartitions)
		parts++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, ballastPartitions, parts)
	var others int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM streamd.streams WHERE stream_name NOT IN ($1, 'streamd.advisories')", ballastStream).Scan(&others))
	require.Zero(t, others, "the cases' streams are deleted")
}
