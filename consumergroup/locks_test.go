package consumergroup

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// openCommitTx begins a transaction and commits the (empty) batch [from, from) of
// partition in it, as a handler does that called CommitTx and goes on working: the
// fence's lock on the partition's ownership row stays until the transaction ends.
func openCommitTx(t *testing.T, pool *pgxpool.Pool, m *member, partition int32, from int64) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	require.NoError(t, m.commitBatch(ctx, tx, partition, from, from, nil))
	return tx
}

// within returns a context that ends after d: what a call that must not wait for a
// handler's transaction gets.
func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestOpenCommitTxDoesNotStallTheGroup: a handler's transaction kept open after its
// CommitTx (legal for up to MaxPollInterval) holds the partition for its owner only:
// a join that gives that partition a pending target, pausing and resuming it,
// heartbeats of healthy members, and the expiry of a dead member that was the
// partition's target all go through at once. Its fence lock was FOR SHARE, which any
// UPDATE of the row waits for: the join waited holding the group row, every other
// group operation and the heartbeats that take the slow path queued behind it, and
// healthy members timed out and were expelled. Only the handover itself (the
// release) waits for the transaction (G1).
func TestOpenCommitTxDoesNotStallTheGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 3)
	group := testdb.Name("g")
	admin := NewAdmin(pool)
	a := join(t, pool, stream, group, "a")
	settle(t, pool, []*member{a})
	c := join(t, pool, stream, group, "c")
	owned := settle(t, pool, []*member{a, c})
	require.Equal(t, []int32{0, 1}, owned["a"])
	const held = int32(1) // a's last partition: the one a join takes from a

	tx := openCommitTx(t, pool, a, held, 0)

	// b joins with a short session; it will die. (A second, not less: on a loaded
	// machine a shorter one expired before a's heartbeat below saw the promise.)
	b, err := memberJoin(within(t, 3*time.Second), pool, stream, group, "b", "", time.Second, time.Minute, nil)
	require.NoError(t, err, "a join that gives the held partition a pending target does not wait")
	asg, err := a.heartbeat(within(t, time.Second), pool, nil)
	require.NoError(t, err)
	require.Equal(t, []int32{held}, asg.Revoking, "the held partition is promised to b")
	_, err = c.heartbeat(within(t, time.Second), pool, nil)
	require.NoError(t, err, "a healthy member's heartbeat does not wait")
	require.NoError(t, admin.Pause(within(t, 3*time.Second), stream, group, 0, held), "pause does not wait")
	require.NoError(t, admin.Resume(within(t, 3*time.Second), stream, group, 0, held), "resume does not wait")

	// b dies: the next heartbeat expires it and cancels the held partition's move.
	waitFor(t, 5*time.Second, "b's session expired", func() bool {
		var expired bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT last_heartbeat + session_timeout_ms * interval '1 millisecond' < now()
			FROM streamd.consumer_registrations WHERE stream_name = $1 AND group_id = $2 AND consumer_id = $3`,
			stream, group, b.consumerID).Scan(&expired))
		return expired
	})
	_, err = c.heartbeat(within(t, time.Second), pool, nil)
	require.NoError(t, err, "expiring a dead member that was the held partition's target does not wait")
	asg, err = a.heartbeat(within(t, time.Second), pool, nil)
	require.NoError(t, err)
	require.Empty(t, asg.Revoking, "b is gone; nothing is promised")
	_, err = b.heartbeat(ctx, pool, nil)
	require.ErrorIs(t, err, ErrFenced)

	// A handover of the held partition waits for the transaction (G1).
	d := join(t, pool, stream, group, "d")
	asg, err = a.heartbeat(within(t, time.Second), pool, nil)
	require.NoError(t, err)
	require.Equal(t, []int32{held}, asg.Revoking)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var releasePID uint32
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&releasePID))
	released := make(chan error, 1)
	go func() { released <- a.release(ctx, conn, []int32{held}, nil) }()
	waitBlockedBy(t, pool, releasePID, backendPID(t, tx), "the release waits for the open CommitTx")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-released)
	asg, err = d.heartbeat(ctx, pool, nil)
	require.NoError(t, err)
	require.Equal(t, []int32{held}, asg.Assigned)
}

// TestEveryHandoverWaitsForAnOpenCommitTx (G1): the fence of a commit locks the
// ownership row FOR KEY SHARE, which only FOR UPDATE and DELETE wait for; so every
// way a partition changes owner must lock it FOR UPDATE first, or a commit accepted
// for the old owner could land after the new owner started. The owner's own release
// and the forced admin operations wait for an open CommitTx of the partition; the old
// owner's commits are fenced afterwards. The ways a member departs (expiry, leave, a
// restart with its instance id) do not wait, and move the partition only after the
// transaction ended: TestDepartureDoesNotWaitForAnOpenCommitTx.
func TestEveryHandoverWaitsForAnOpenCommitTx(t *testing.T) {
	t.Parallel()
	type setup struct {
		pool          *pgxpool.Pool
		stream, group string
		owner         *member // owns the held partition, with a live session
	}
	for _, tc := range []struct {
		name string
		// partitions of the stream (default 1); the owner holds the last one.
		partitions int32
		// prepare runs before the CommitTx; handover is what must wait for it.
		prepare  func(t *testing.T, s setup)
		handover func(ctx context.Context, conn *pgxpool.Conn, s setup) error
	}{
		{
			name:       "release to a waiting member",
			partitions: 2, // a owns both, b waits for partition 1
			prepare: func(t *testing.T, s setup) {
				join(t, s.pool, s.stream, s.group, "b")
			},
			handover: func(ctx context.Context, conn *pgxpool.Conn, s setup) error {
				return s.owner.release(ctx, conn, []int32{1}, nil)
			},
		},
		{
			name: "forced offset reset",
			handover: func(ctx context.Context, conn *pgxpool.Conn, s setup) error {
				_, err := conn.Exec(ctx, "SELECT * FROM streamd.reset_group_offsets($1, $2, 'earliest', NULL, NULL, NULL, true, NULL)",
					s.stream, s.group)
				return err
			},
		},
		{
			name: "forced group deletion",
			handover: func(ctx context.Context, conn *pgxpool.Conn, s setup) error {
				_, err := conn.Exec(ctx, "SELECT streamd.delete_group($1, $2, true, NULL)", s.stream, s.group)
				return err
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			n := max(tc.partitions, 1)
			held := n - 1
			s := setup{pool: pool, stream: newStream(t, pool, n), group: testdb.Name("g")}
			var err error
			s.owner, err = memberJoin(ctx, pool, s.stream, s.group, "a-1", "host-a", testSession, time.Minute, nil)
			require.NoError(t, err)
			asg, err := s.owner.heartbeat(ctx, pool, nil)
			require.NoError(t, err)
			require.Contains(t, asg.Assigned, held)
			if tc.prepare != nil {
				tc.prepare(t, s)
			}
			tx := openCommitTx(t, pool, s.owner, held, 0)

			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			var pid uint32
			require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
			done := make(chan error, 1)
			go func() { done <- tc.handover(ctx, conn, s) }()
			waitBlockedBy(t, pool, pid, backendPID(t, tx), "the handover waits for the open CommitTx")
			select {
			case err := <-done:
				t.Fatalf("the handover finished while the CommitTx was open: %v", err)
			default:
			}
			require.NoError(t, tx.Commit(ctx))
			require.NoError(t, <-done)
			require.ErrorIs(t, s.owner.commit(ctx, pool, []PartitionOffset{{Partition: held, Offset: 0}}, nil), ErrFenced,
				"the old owner is fenced after the handover")
		})
	}
}
