package consumergroup

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// Seed 003's offset statements, verbatim (with "offset" quoted and search_path set to
// streamd), on a stream of one partition (the seed's model): the commit stores the
// group's next offset (the seed's ON CONFLICT on the consumer plans, and a second
// commit updates), the "get consumer position" query answers it, and the seed's
// consumer_group_status queries show it, with a stale member that owns nothing. For
// a stream of several partitions the seed form is refused and the error names the
// per-partition form; bad offsets are refused; neither writes anything. In a
// transaction that is rolled back, so the seed's literal names leave nothing behind.
func TestSeed003OffsetCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	exec := func(sql string) {
		t.Helper()
		_, err := tx.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	// refused runs sql in a savepoint and returns its error, mapped to the sentinels.
	refused := func(sql string) error {
		t.Helper()
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		_, err = sp.Exec(ctx, sql)
		require.Error(t, err, sql)
		require.NoError(t, sp.Rollback(ctx))
		return sqlerr.Wrap(err)
	}
	exec(`SET LOCAL search_path = streamd, public`)
	exec(`SELECT create_stream('orders', 1)`)
	exec(`INSERT INTO events (event_id, stream_name, event_type, data) SELECT 'e' || g, 'orders', 'OrderPlacedEvent', '{}' FROM generate_series(1, 1500) g`)

	const commit = `INSERT INTO consumer_offsets (stream_name, group_id, consumer_id, "offset")
VALUES ('orders', 'order-processing', 'worker-1', 1000)
ON CONFLICT (stream_name, group_id, consumer_id)
DO UPDATE SET "offset" = EXCLUDED."offset", updated_at = NOW();`
	const position = `SELECT "offset" FROM consumer_offsets
WHERE stream_name = 'orders'
  AND group_id = 'order-processing'
  AND consumer_id = 'worker-1';`
	getPosition := func() int64 {
		t.Helper()
		var pos int64
		require.NoError(t, tx.QueryRow(ctx, position).Scan(&pos))
		return pos
	}
	exec(commit)
	require.EqualValues(t, 1000, getPosition())
	exec(commit) // the conflict path
	require.EqualValues(t, 1000, getPosition())
	var rows int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM consumer_offsets WHERE stream_name = 'orders'`).Scan(&rows))
	require.Equal(t, 1, rows, "one offset per group and partition")

	// Another consumer of the group commits: the group's position moves, and it is
	// that consumer's now.
	exec(`INSERT INTO consumer_offsets (stream_name, group_id, consumer_id, "offset") VALUES ('orders', 'order-processing', 'worker-2', 1200)
	      ON CONFLICT (stream_name, group_id, consumer_id) DO UPDATE SET "offset" = EXCLUDED."offset", updated_at = NOW()`)
	var pos int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT "offset" FROM consumer_offsets WHERE stream_name = 'orders' AND group_id = 'order-processing' AND consumer_id = 'worker-2'`).Scan(&pos))
	require.EqualValues(t, 1200, pos)
	require.ErrorIs(t, tx.QueryRow(ctx, position).Scan(&pos), pgx.ErrNoRows)
	exec(commit)
	require.EqualValues(t, 1000, getPosition())

	// Bad input: nothing written.
	err = refused(`INSERT INTO consumer_offsets (stream_name, group_id, consumer_id, "offset") VALUES ('orders', 'order-processing', 'worker-1', 2000)`)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorContains(t, err, "outside [0, 1500]")
	err = refused(`INSERT INTO consumer_offsets (stream_name, group_id, consumer_id, "offset") VALUES ('no-such-stream', 'order-processing', 'worker-1', 1)`)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
	exec(`SELECT create_stream('orders-3', 3)`)
	err = refused(`INSERT INTO consumer_offsets (stream_name, group_id, consumer_id, "offset") VALUES ('orders-3', 'order-processing', 'worker-1', 0)
	               ON CONFLICT (stream_name, group_id, consumer_id) DO UPDATE SET "offset" = EXCLUDED."offset", updated_at = NOW()`)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorContains(t, err, `has 3 partitions`)
	require.ErrorContains(t, err, `ON CONFLICT (stream_name, group_id, partition)`)
	require.EqualValues(t, 1000, getPosition())
	var groups int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM consumer_groups WHERE stream_name IN ('orders-3', 'no-such-stream')`).Scan(&groups))
	require.Zero(t, groups)
	// The per-partition form the error names works.
	exec(`INSERT INTO consumer_offsets (stream_name, group_id, partition, "offset") VALUES ('orders-3', 'order-processing', 2, 0)
	      ON CONFLICT (stream_name, group_id, partition) DO UPDATE SET "offset" = EXCLUDED."offset", updated_at = now()`)

	// The seed's monitoring queries. worker-1 owns the partition; worker-2 is
	// registered, owns nothing and missed its heartbeats: a row of its own.
	exec(`INSERT INTO consumer_registrations (stream_name, group_id, consumer_id, member_epoch) VALUES ('orders', 'order-processing', 'worker-1', 1)`)
	exec(`INSERT INTO consumer_partitions (stream_name, group_id, partition, owner_id, owner_epoch) VALUES ('orders', 'order-processing', 0, 'worker-1', 1)`)
	exec(`INSERT INTO consumer_registrations (stream_name, group_id, consumer_id, member_epoch, last_heartbeat)
	      VALUES ('orders', 'order-processing', 'worker-2', 1, now() - interval '1 hour')`)
	collect := func(sql string) []map[string]any {
		t.Helper()
		rows, err := tx.Query(ctx, sql)
		require.NoError(t, err)
		all, err := pgx.CollectRows(rows, pgx.RowToMap)
		require.NoError(t, err)
		var out []map[string]any
		for _, r := range all {
			if r["stream_name"] == "orders" {
				out = append(out, r)
			}
		}
		return out
	}
	lag := collect(`SELECT * FROM consumer_group_status
WHERE lag > 1000
ORDER BY lag DESC;`)
	require.Empty(t, lag, "lag is 500")
	stale := collect(`SELECT * FROM consumer_group_status
WHERE is_stale = true;`)
	require.Len(t, stale, 1)
	require.Equal(t, "worker-2", stale[0]["consumer_id"])
	require.Nil(t, stale[0]["partition"])
	require.Equal(t, "owns_nothing", stale[0]["reason"])
	all := collect(`SELECT * FROM consumer_group_status ORDER BY consumer_id`)
	require.Len(t, all, 2)
	require.Equal(t, "worker-1", all[0]["consumer_id"])
	require.EqualValues(t, 1000, all[0]["current_offset"])
	require.EqualValues(t, 500, all[0]["lag"])
	var parts int
	require.NoError(t, tx.QueryRow(ctx, `SELECT partitions FROM consumer_group_summary WHERE stream_name = 'orders'`).Scan(&parts))
	require.Equal(t, 1, parts, "a member's row is no partition")
}

// The library's commits record the member in committed_by and keep a seed consumer's
// name on the row, so the seed's position query follows the group; a member that
// owns several partitions commits them all (consumer_id is unique in a group).
func TestSeedOffsetsAndLibraryCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 10)
	m := join(t, pool, stream, group, "a")
	_, err := m.heartbeat(ctx, pool, nil)
	require.NoError(t, err)
	require.NoError(t, m.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 5}}, nil))

	_, err = pool.Exec(ctx, `INSERT INTO streamd.consumer_offsets (stream_name, group_id, consumer_id, "offset") VALUES ($1, $2, 'worker-1', 3)
		ON CONFLICT (stream_name, group_id, consumer_id) DO UPDATE SET "offset" = EXCLUDED."offset", updated_at = NOW()`, stream, group)
	require.NoError(t, err)
	position := func() (int64, string) {
		t.Helper()
		var pos int64
		var by string
		require.NoError(t, pool.QueryRow(ctx, `SELECT "offset", committed_by FROM streamd.consumer_offsets
			WHERE stream_name = $1 AND group_id = $2 AND consumer_id = 'worker-1'`, stream, group).Scan(&pos, &by))
		return pos, by
	}
	pos, by := position()
	require.EqualValues(t, 3, pos)
	require.Equal(t, "worker-1", by)
	off, _, err := committedOffset(ctx, pool, stream, group, 0)
	require.NoError(t, err)
	require.EqualValues(t, 3, off, "the seed form sets the group's offset")

	require.NoError(t, m.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 8}}, nil))
	pos, by = position()
	require.EqualValues(t, 8, pos)
	require.Equal(t, m.consumerID, by)

	multi := newStream(t, pool, 3)
	produce(t, pool, multi, 0, 30)
	m3 := join(t, pool, multi, group, "b")
	_, err = m3.heartbeat(ctx, pool, nil)
	require.NoError(t, err)
	require.NoError(t, m3.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 1}, {Partition: 1, Offset: 1}, {Partition: 2, Offset: 1}}, nil))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.consumer_offsets WHERE stream_name = $1 AND committed_by = $2`,
		multi, m3.consumerID).Scan(&n))
	require.Equal(t, 3, n)
}
