package advisory_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/advisory"
	"github.com/streamd/streamd/internal/testdb"
)

// TestReportThenAppendDoesNotDeadlockWithRetention: two real transactions that take
// the advisory stream's head row and a stream's head row in opposite orders. T1 reports
// a fact (a forced offset reset of a group: two advisories) and then appends to stream
// X; T2 is retention of X (streamd.retention_advance, the Go runner's step), which
// moves X's head row and reports the live group behind it. T2 runs between T1's report
// and T1's append. When advise appended at once, T1 held the advisory head row and
// waited for X's, T2 held X's and waited for the advisory one: PostgreSQL aborted one
// of them with 40P01. With the advisories appended at commit (migration 0088) both
// commit, and every advisory is there.
func TestReportThenAppendDoesNotDeadlockWithRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	from := head(t, pool)
	x := newStream(t, pool, 1)
	produce(t, pool, x, 10)
	behind := testdb.Name("behind")
	var epoch int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.join_group($1, $2, 'm', NULL, 600000, 600000, NULL)", x, behind).Scan(&epoch))
	_, err := pool.Exec(ctx, "SELECT streamd.commit_offsets($1, $2, 'm', $3, ARRAY[0], ARRAY[2::bigint], NULL, NULL)", x, behind, epoch)
	require.NoError(t, err)
	y := newStream(t, pool, 1)
	group := testdb.Name("g")
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.join_group($1, $2, 'm', NULL, 600000, 600000, NULL)", y, group).Scan(&epoch))

	c1, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	defer c1.Close(ctx)
	c2, err := pgx.Connect(ctx, testdb.URL(t))
	require.NoError(t, err)
	defer c2.Close(ctx)

	t1, err := c1.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = t1.Rollback(ctx) }()
	_, err = t1.Exec(ctx, "SELECT * FROM streamd.reset_group_offsets($1, $2, 'earliest', NULL, NULL, NULL, true, NULL)", y, group)
	require.NoError(t, err)

	t2Done := make(chan error, 1)
	go func() { // owner: this test, which waits for t2Done below
		t2Done <- pgx.BeginFunc(ctx, c2, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT streamd.retention_advance($1, 0, 5)", x)
			return err
		})
	}()
	// T2 has moved X's head: it is waiting for a lock, or done.
	pid2 := c2.PgConn().PID()
	var t2Err error
	finished := false
	testdb.WaitFor(t, 20*time.Second, "retention holds the head row of X", func() bool {
		select {
		case t2Err = <-t2Done:
			finished = true
			return true
		default:
		}
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity WHERE pid = $1",
			pid2).Scan(&waiting))
		return waiting
	})

	// T1 appends to X, then commits.
	_, err1 := t1.Exec(ctx, "INSERT INTO streamd.events (stream_name, data) VALUES ($1, '1')", x)
	if err1 == nil {
		err1 = t1.Commit(ctx)
	}
	if !finished {
		select {
		case t2Err = <-t2Done:
		case <-time.After(20 * time.Second):
			t.Fatal("retention did not end")
		}
	}
	require.NoError(t, err1, "the reporting transaction")
	require.NoError(t, t2Err, "retention")

	reset := await[advisory.OffsetsReset](t, pool, from, advisory.TypeOffsetsReset, y+"/"+group, nil)
	require.True(t, reset.Forced)
	gone := await[advisory.MemberGone](t, pool, from, advisory.TypeMemberFenced, y+"/"+group, nil)
	require.Equal(t, "offsets_reset", gone.Reason)
	unread := await[advisory.UnreadDeleted](t, pool, from, advisory.TypeUnreadDeleted, x, nil)
	require.Equal(t, int64(5), unread.LogStartOffset)
	require.Equal(t, []advisory.UnreadGroup{{Group: behind, CommittedOffset: 2, UnreadDeleted: 3}}, unread.Groups)
}
