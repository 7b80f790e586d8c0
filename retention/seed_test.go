package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// Seed 003's usage SQL, as written (with "offset" quoted and search_path set to
// streamd), runs against the migrated schema and answers from streamd's tables. It
// runs in a transaction that is rolled back, so the seed's literal names ('orders')
// leave nothing behind.
func TestSeed003UsageSQL(t *testing.T) {
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
	exec(`SET LOCAL search_path = streamd, public`)
	exec(`SELECT create_stream('orders', 1)`)
	exec(`INSERT INTO events (event_id, stream_name, event_type, data) SELECT 'e' || g, 'orders', 'OrderPlacedEvent', '{}' FROM generate_series(1, 1500) g`)
	exec(`INSERT INTO consumer_groups (stream_name, group_id) VALUES ('orders', 'order-processing')`)
	exec(`INSERT INTO consumer_registrations (stream_name, group_id, consumer_id, member_epoch, last_heartbeat)
	      VALUES ('orders', 'order-processing', 'worker-1', 1, now() - interval '1 hour')`)
	exec(`INSERT INTO consumer_partitions (stream_name, group_id, partition, owner_id, owner_epoch) VALUES ('orders', 'order-processing', 0, 'worker-1', 1)`)
	exec(`INSERT INTO consumer_offsets (stream_name, group_id, partition, "offset", consumer_id) VALUES ('orders', 'order-processing', 0, 100, 'worker-1')`)

	// Stream configuration, exactly the seed's example.
	exec(`INSERT INTO stream_configurations (stream_name, retention_config, performance_config)
VALUES (
    'orders',
    '{"maxAge": "90.00:00:00", "maxSizeBytes": 10737418240}'::JSONB,
    '{"batchSize": 1000, "enableCompression": true}'::JSONB
)`)

	// Get consumer position.
	var pos int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT "offset" FROM consumer_offsets
WHERE stream_name = 'orders'
  AND group_id = 'order-processing'
  AND consumer_id = 'worker-1'`).Scan(&pos))
	require.Equal(t, int64(100), pos)

	// Heartbeat and cleanup functions.
	exec(`SELECT update_consumer_heartbeat('orders', 'order-processing', 'worker-1')`)

	// Monitor consumer lag.
	rows, err := tx.Query(ctx, `SELECT * FROM consumer_group_status
WHERE lag > 1000
ORDER BY lag DESC`)
	require.NoError(t, err)
	lagRows, err := pgx.CollectRows(rows, pgx.RowToMap)
	require.NoError(t, err)
	lagRows = ofOrders(lagRows) // the shared database holds other tests' groups too
	require.Len(t, lagRows, 1)
	require.Equal(t, "worker-1", lagRows[0]["consumer_id"])
	require.EqualValues(t, 100, lagRows[0]["current_offset"])
	require.EqualValues(t, 1500, lagRows[0]["stream_head"])
	require.EqualValues(t, 1400, lagRows[0]["lag"])

	// Find stale consumers (none: the heartbeat above refreshed worker-1).
	rows, err = tx.Query(ctx, `SELECT * FROM consumer_group_status
WHERE is_stale = true`)
	require.NoError(t, err)
	stale, err := pgx.CollectRows(rows, pgx.RowToMap)
	require.NoError(t, err)
	require.Empty(t, ofOrders(stale))

	// Retention functions, and the status view.
	var n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT apply_time_retention('orders', 86400)`).Scan(&n))
	require.Equal(t, 0, n)
	require.NoError(t, tx.QueryRow(ctx, `SELECT apply_size_retention('orders', 1000)`).Scan(&n))
	require.Equal(t, 500, n)
	rows, err = tx.Query(ctx, `SELECT * FROM retention_policy_status`)
	require.NoError(t, err)
	status, err := pgx.CollectRows(rows, pgx.RowToMap)
	require.NoError(t, err)
	require.Len(t, ofOrders(status), 1)
	orders := ofOrders(status)[0]
	require.EqualValues(t, 90*86400, orders["max_age_seconds"])
	require.Nil(t, orders["max_event_count"])
	require.Equal(t, "partition", orders["limits_per"], "the count limit is per partition, and the view says so")
	require.Equal(t, true, orders["enabled"])
	require.EqualValues(t, 1000, orders["current_event_count"])
	require.EqualValues(t, int64(10737418240), orders["max_size_bytes"])
	oldest, newest := orders["oldest_event"].(time.Time), orders["newest_event"].(time.Time)
	require.False(t, oldest.After(newest))
	var firstTS time.Time
	require.NoError(t, tx.QueryRow(ctx, `SELECT "timestamp" FROM events WHERE stream_name = 'orders' AND "offset" = 500`).Scan(&firstTS))
	require.True(t, firstTS.Equal(oldest), "oldest_event is the first retained event")

	// Everything below the group's offset but above the log start: the group is now
	// behind the log start, and the progress view says so.
	var reason *string
	require.NoError(t, tx.QueryRow(ctx, `SELECT reason FROM consumer_group_status WHERE stream_name = 'orders'`).Scan(&reason))
	require.NotNil(t, reason)
	require.Equal(t, "behind_log_start", *reason)

	require.NoError(t, tx.QueryRow(ctx, `SELECT cleanup_stale_consumers()`).Scan(&n))
}

func ofOrders(rows []map[string]any) []map[string]any {
	var out []map[string]any
	for _, r := range rows {
		if r["stream_name"] == "orders" {
			out = append(out, r)
		}
	}
	return out
}
