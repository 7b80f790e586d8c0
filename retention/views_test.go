package retention_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// consumer_group_status says why each partition of a group is not progressing, and
// nothing for one that is. A partition the stream gained while no member was there to
// rebalance (6) is listed too, unowned, with its lag; an owner without a registration
// (7) is stale.
func TestConsumerGroupProgressReasons(t *testing.T) {
	t.Parallel()
	f := setup(t, 6)
	f.produce(5, 10)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := f.pool.Exec(f.ctx, sql, append([]any{f.stream}, args...)...)
		require.NoError(t, err, sql)
	}
	exec(`INSERT INTO streamd.consumer_groups (stream_name, group_id) VALUES ($1, 'g')`)
	exec(`INSERT INTO streamd.consumer_registrations (stream_name, group_id, consumer_id, member_epoch, last_heartbeat)
	      VALUES ($1, 'g', 'live', 2, now()), ($1, 'g', 'gone', 1, $2)`, time.Now().Add(-time.Hour))
	exec(`INSERT INTO streamd.consumer_partitions (stream_name, group_id, partition, owner_id, owner_epoch, paused) VALUES
	      ($1, 'g', 0, 'live', 2, false), ($1, 'g', 1, 'live', 2, true), ($1, 'g', 2, NULL, NULL, false),
	      ($1, 'g', 3, 'gone', 1, false), ($1, 'g', 4, 'live', 1, false), ($1, 'g', 5, 'live', 2, false)`)
	f.commit("g", 5, 2)
	require.NoError(t, f.client.CreateStream(f.ctx, f.stream, 8))
	f.produce(6, 3)
	exec(`INSERT INTO streamd.consumer_partitions (stream_name, group_id, partition, owner_id, owner_epoch, paused)
	      VALUES ($1, 'g', 7, 'vanished', 3, false)`)
	exec(`SELECT streamd.retention_advance($1, 5, 6)`)
	exec(`SELECT streamd.retention_delete_batch($1, 5, 100)`)

	rows, err := f.pool.Query(f.ctx, `SELECT partition, coalesce(reason, ''), lag, is_stale FROM streamd.consumer_group_status
		WHERE stream_name = $1 ORDER BY partition`, f.stream)
	require.NoError(t, err)
	defer rows.Close()
	want := []string{"", "paused", "unowned", "owner_stale", "fenced", "behind_log_start", "unowned", "owner_stale"}
	i := 0
	for rows.Next() {
		var (
			p      int32
			reason string
			lag    int64
			stale  bool
		)
		require.NoError(t, rows.Scan(&p, &reason, &lag, &stale))
		require.Equal(t, want[i], reason, "partition %d", p)
		require.Equal(t, p == 3 || p == 7, stale, "partition %d", p)
		if p == 5 {
			require.Equal(t, int64(4), lag, "lag counts from the log start when the group is behind it")
		}
		if p == 6 {
			require.Equal(t, int64(3), lag, "a partition never assigned lags by all it holds")
		}
		i++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(want), i)
}
