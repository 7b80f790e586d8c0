package consumergroup

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
)

// sessionExpired reports whether the member's session is past its timeout by the
// server's clock (true also when it has no registration).
func sessionExpired(t *testing.T, pool *pgxpool.Pool, stream, group, id string) bool {
	t.Helper()
	var live bool
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM streamd.consumer_registrations
		WHERE stream_name = $1 AND group_id = $2 AND consumer_id = $3
		  AND last_heartbeat + session_timeout_ms * interval '1 millisecond' >= clock_timestamp())`,
		stream, group, id).Scan(&live))
	return !live
}

// registered reports whether the member is registered in the group.
func registered(t *testing.T, pool *pgxpool.Pool, stream, group, id string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM streamd.consumer_registrations
		WHERE stream_name = $1 AND group_id = $2 AND consumer_id = $3)`, stream, group, id).Scan(&ok))
	return ok
}

// ownerOf returns the owner of a partition of the group, "" when it has none.
func ownerOf(t *testing.T, pool *pgxpool.Pool, stream, group string, partition int32) string {
	t.Helper()
	var owner *string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT (SELECT owner_id FROM streamd.consumer_partitions
		WHERE stream_name = $1 AND group_id = $2 AND partition = $3)`, stream, group, partition).Scan(&owner))
	if owner == nil {
		return ""
	}
	return *owner
}

// requireRefusedAtCommit commits tx and requires the COMMIT to be refused by the
// check at COMMIT (SD108, session expired), which the worker reads as ErrFenced.
func requireRefusedAtCommit(t *testing.T, tx pgx.Tx) {
	t.Helper()
	err := tx.Commit(context.Background())
	require.Error(t, err, "the transaction of a member that is gone must not commit")
	require.Equal(t, sqlerr.FencedSession, sqlerr.Code(err), "refused at COMMIT: %v", err)
	require.ErrorIs(t, fencedAtCommit(err), ErrFenced)
}

// TestFrozenCommitTxDoesNotStallTheGroup is issue 16's reproduction in plain SQL: A
// called commit_batch in its handler's transaction and froze before COMMIT; its
// session expired. B's heartbeat expires A and must not wait for A's transaction
// (it waited FOR UPDATE behind A's FOR KEY SHARE holding the group row, so every
// heartbeat and join queued and the healthy members were expelled); a join goes
// through too. The partition stays A's while the transaction is open (G1), A's COMMIT
// is refused when it wakes (nothing of it is written), and the next heartbeat moves
// the partition on.
func TestFrozenCommitTxDoesNotStallTheGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream, group := testdb.Name("repro"), "g"
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec("SELECT streamd.create_stream($1, 1)", stream)
	exec(`INSERT INTO streamd.events (stream_name, event_type, data) VALUES ($1, 't', '{}')`, stream)
	var epochA, epochB, epochC int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.join_group($1, $2, 'A', NULL, 1000, 60000, NULL)", stream, group).Scan(&epochA))
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.join_group($1, $2, 'B', NULL, 60000, 60000, NULL)", stream, group).Scan(&epochB))
	require.Equal(t, "A", ownerOf(t, pool, stream, group, 0))

	// Session 1: A's handler transaction, frozen after its commit_batch.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT streamd.commit_batch($1, $2, 'A', $3, 0, 0, 1, NULL)", stream, group, epochA)
	require.NoError(t, err)
	waitFor(t, 5*time.Second, "A's session expired", func() bool { return sessionExpired(t, pool, stream, group, "A") })

	// Session 2: B's heartbeat expires A without waiting for A's transaction.
	var assigned []int32
	err = pool.QueryRow(within(t, 2*time.Second), "SELECT assigned FROM streamd.group_heartbeat($1, $2, 'B', $3, NULL)",
		stream, group, epochB).Scan(&assigned)
	require.NoError(t, err, "B's heartbeat must not wait for A's open transaction")
	require.Empty(t, assigned, "the partition stays A's while A's commit is in flight (G1)")
	require.False(t, registered(t, pool, stream, group, "A"), "A was expired")
	require.NoError(t, pool.QueryRow(within(t, 2*time.Second), "SELECT streamd.join_group($1, $2, 'C', NULL, 60000, 60000, NULL)",
		stream, group).Scan(&epochC), "a join must not wait either")
	require.Equal(t, "A", ownerOf(t, pool, stream, group, 0))
	_, err = pool.Exec(ctx, "SELECT streamd.commit_offsets($1, $2, 'B', $3, '{0}', '{1}', NULL, NULL)", stream, group, epochB)
	require.ErrorIs(t, sqlerr.Wrap(err), ErrFenced, "nobody else commits the partition meanwhile")

	// A wakes: its COMMIT is refused and its offset is not written.
	requireRefusedAtCommit(t, tx)
	_, ok, err := committedOffset(ctx, pool, stream, group, 0)
	require.NoError(t, err)
	require.False(t, ok, "A's commit rolled back")

	// The next heartbeat hands the partition over.
	var b, c []int32
	require.NoError(t, pool.QueryRow(ctx, "SELECT assigned FROM streamd.group_heartbeat($1, $2, 'B', $3, NULL)", stream, group, epochB).Scan(&b))
	require.NoError(t, pool.QueryRow(ctx, "SELECT assigned FROM streamd.group_heartbeat($1, $2, 'C', $3, NULL)", stream, group, epochC).Scan(&c))
	require.Len(t, append(b, c...), 1, "the partition moved to B or C: B %v, C %v", b, c)
}

// TestDepartureDoesNotWaitForAnOpenCommitTx (G1 without the stall): the ways a member
// departs (its session expires, it leaves, a restart takes its instance id) lock its
// ownership rows FOR UPDATE SKIP LOCKED, so they never wait for its open CommitTx
// while holding the group row. The partitions they can lock move at once; the one the
// transaction holds stays the departed member's until the transaction ended (its
// COMMIT is refused, nothing of it written), then moves at the next heartbeat or reap.
func TestDepartureDoesNotWaitForAnOpenCommitTx(t *testing.T) {
	t.Parallel()
	type run struct {
		pool          *pgxpool.Pool
		stream, group string
	}
	reap := func(t *testing.T, r run) {
		_, err := r.pool.Exec(context.Background(), "SELECT streamd.cleanup_stale_consumers()")
		require.NoError(t, err)
	}
	for _, tc := range []struct {
		name string
		// partitions of the stream; the owner holds partition 0 in its transaction.
		partitions int32
		session    time.Duration // the owner's
		// others join after the owner took every partition; depart runs while the
		// owner's CommitTx is open and must not wait; then, before the transaction
		// ends, the partitions not held have moved as moved says (nil: not checked).
		others func(t *testing.T, r run) []*member
		depart func(ctx context.Context, t *testing.T, r run, owner *member, others []*member) error
		moved  func(t *testing.T, r run, others []*member)
		// after runs once the transaction ended: the held partition's new owner.
		after func(t *testing.T, r run, others []*member) string
	}{
		{
			name: "expiry by the reaper", partitions: 1, session: time.Second,
			depart: func(ctx context.Context, t *testing.T, r run, owner *member, _ []*member) error {
				waitFor(t, 5*time.Second, "the owner's session expired", func() bool {
					return sessionExpired(t, r.pool, r.stream, r.group, owner.consumerID)
				})
				_, err := r.pool.Exec(ctx, "SELECT streamd.cleanup_stale_consumers()")
				return err
			},
			after: func(t *testing.T, r run, _ []*member) string { reap(t, r); return "" },
		},
		{
			name: "expiry by a heartbeat, of an owner of two partitions", partitions: 2, session: time.Second,
			others: func(t *testing.T, r run) []*member { return []*member{join(t, r.pool, r.stream, r.group, "b")} },
			depart: func(ctx context.Context, t *testing.T, r run, owner *member, others []*member) error {
				waitFor(t, 5*time.Second, "the owner's session expired", func() bool {
					return sessionExpired(t, r.pool, r.stream, r.group, owner.consumerID)
				})
				_, err := others[0].heartbeat(ctx, r.pool, nil)
				return err
			},
			moved: func(t *testing.T, r run, others []*member) {
				asg, err := others[0].heartbeat(context.Background(), r.pool, nil)
				require.NoError(t, err)
				require.Equal(t, []int32{1}, asg.Assigned, "the partition no transaction holds moved at once")
			},
			after: func(t *testing.T, r run, others []*member) string {
				asg, err := others[0].heartbeat(context.Background(), r.pool, nil)
				require.NoError(t, err)
				require.Equal(t, []int32{0, 1}, asg.Assigned)
				return others[0].consumerID
			},
		},
		{
			name: "leave", partitions: 1, session: testSession,
			depart: func(ctx context.Context, t *testing.T, r run, owner *member, _ []*member) error {
				ok, err := owner.leave(ctx, r.pool, nil)
				require.True(t, ok)
				return err
			},
			after: func(t *testing.T, r run, _ []*member) string { reap(t, r); return "" },
		},
		{
			name: "restart with the owner's instance id", partitions: 1, session: testSession,
			depart: func(ctx context.Context, t *testing.T, r run, owner *member, others []*member) error {
				_, err := memberJoin(ctx, r.pool, r.stream, r.group, "a-2", "host-a", testSession, time.Minute, nil)
				return err
			},
			after: func(t *testing.T, r run, _ []*member) string { reap(t, r); return "a-2" },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			r := run{pool: pool, stream: newStream(t, pool, tc.partitions), group: testdb.Name("g")}
			owner, err := memberJoin(ctx, pool, r.stream, r.group, "a-1", "host-a", tc.session, time.Minute, nil)
			require.NoError(t, err)
			asg, err := owner.heartbeat(ctx, pool, nil)
			require.NoError(t, err)
			require.Len(t, asg.Assigned, int(tc.partitions))
			var others []*member
			if tc.others != nil {
				others = tc.others(t, r)
			}
			tx := openCommitTx(t, pool, owner, 0, 0)

			require.NoError(t, tc.depart(within(t, 5*time.Second), t, r, owner, others), "the departure does not wait")
			require.Equal(t, owner.consumerID, ownerOf(t, pool, r.stream, r.group, 0),
				"the held partition stays the departed owner's while its commit is in flight (G1)")
			if tc.moved != nil {
				tc.moved(t, r, others)
			}
			reap(t, r) // a reap meanwhile moves nothing held either
			require.Equal(t, owner.consumerID, ownerOf(t, pool, r.stream, r.group, 0))

			requireRefusedAtCommit(t, tx)
			_, ok, err := committedOffset(ctx, pool, r.stream, r.group, 0)
			require.NoError(t, err)
			require.False(t, ok, "nothing of the departed member's transaction was written")
			require.Equal(t, tc.after(t, r, others), ownerOf(t, pool, r.stream, r.group, 0), "moved once the transaction ended")
			require.ErrorIs(t, owner.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 0}}, nil), ErrFenced)
		})
	}
}

// holdGroupRow locks the group's row as a group operation does (FOR NO KEY UPDATE)
// in a transaction of its own, and returns it with its backend pid.
func holdGroupRow(t *testing.T, pool *pgxpool.Pool, stream, group string) (pgx.Tx, uint32) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, "SELECT 1 FROM streamd.consumer_groups WHERE stream_name = $1 AND group_id = $2 FOR NO KEY UPDATE", stream, group)
	require.NoError(t, err)
	return tx, backendPID(t, tx)
}

// releaseGroupRow ends the holder's transaction and returns the server's time just
// before it did: whatever waited for the row got it after that.
func releaseGroupRow(t *testing.T, tx pgx.Tx) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, tx.QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&at))
	require.NoError(t, tx.Commit(context.Background()))
	return at
}

// acquirePID returns a connection of the pool and its backend pid.
func acquirePID(t *testing.T, pool *pgxpool.Pool) (*pgxpool.Conn, uint32) {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	var pid uint32
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
	return conn, pid
}

// waitedLongerThan waits until the statement running on backend pid has run for
// longer than d by the server's clock.
func waitedLongerThan(t *testing.T, pool *pgxpool.Pool, pid uint32, d time.Duration) {
	t.Helper()
	waitFor(t, d+5*time.Second, "the statement waited longer than "+d.String(), func() bool {
		var long bool
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT coalesce((SELECT clock_timestamp() - query_start > $2::interval
			FROM pg_stat_activity WHERE pid = $1), false)`, int(pid), d.String()).Scan(&long))
		return long
	})
}

// TestJoinThatWaitedIsNotBornExpired (the clock rule): a join that waited for the
// group row longer than its session timeout registers a session that starts when it
// got the row. It stamped now(), the start of its statement, and the member was
// expired on arrival (fenced a few milliseconds after joining, a second rebalance).
func TestJoinThatWaitedIsNotBornExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	join(t, pool, stream, group, "x") // the group exists
	const session = 500 * time.Millisecond

	holder, holderPID := holdGroupRow(t, pool, stream, group)
	conn, pid := acquirePID(t, pool)
	joined := make(chan *member, 1)
	go func() {
		m, err := memberJoin(ctx, conn, stream, group, "late", "", session, time.Minute, nil)
		if err != nil {
			t.Error(err)
		}
		joined <- m
	}()
	waitBlockedBy(t, pool, pid, holderPID, "the join waits for the group row")
	waitedLongerThan(t, pool, pid, 2*session)
	released := releaseGroupRow(t, holder)
	m := <-joined
	require.NotNil(t, m)

	var registeredAt, last time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT registered_at, last_heartbeat FROM streamd.consumer_registrations
		WHERE stream_name = $1 AND group_id = $2 AND consumer_id = $3`, stream, group, m.consumerID).Scan(&registeredAt, &last))
	require.False(t, last.Before(released), "session starts after the wait: %v, row released at %v", last, released)
	require.False(t, registeredAt.Before(released))
}

// TestHeartbeatThatWaitedIsNotExpired (the clock rule): a heartbeat that waited for
// the group row (it had a dead member to expire) longer than the session timeout
// keeps its member: the member was in time when the heartbeat arrived, and its new
// session starts when the heartbeat got the row. The others are judged by that later
// time too: a member whose session ran out during the wait is expired.
func TestHeartbeatThatWaitedIsNotExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 2)
	group := testdb.Name("g")
	// Long enough that m's heartbeat below arrives within m's session, and other's,
	// on a loaded machine.
	const session = 1500 * time.Millisecond
	mustJoin := func(id string, session time.Duration) *member {
		m, err := memberJoin(ctx, pool, stream, group, id, "", session, time.Minute, nil)
		require.NoError(t, err)
		return m
	}
	other := mustJoin("other", session)
	m := mustJoin("m", session)
	dead := mustJoin("dead", 10*time.Millisecond) // makes m's heartbeat take the group row (last: a join expires it)
	// m's heartbeat takes the group row only when it finds a member past its session:
	// started within dead's 10 ms, it found none, never waited, and the wait below
	// timed out (seen once in a clean-clone make test).
	waitFor(t, 5*time.Second, "dead's session ran out", func() bool {
		return sessionExpired(t, pool, stream, group, dead.consumerID)
	})

	holder, holderPID := holdGroupRow(t, pool, stream, group)
	conn, pid := acquirePID(t, pool)
	done := make(chan error, 1)
	go func() { _, err := m.heartbeat(ctx, conn, nil); done <- err }()
	waitBlockedBy(t, pool, pid, holderPID, "the heartbeat waits for the group row")
	waitFor(t, 5*time.Second, "m's and other's sessions ran out during the wait", func() bool {
		return sessionExpired(t, pool, stream, group, m.consumerID) && sessionExpired(t, pool, stream, group, other.consumerID)
	})
	released := releaseGroupRow(t, holder)
	require.NoError(t, <-done, "m's heartbeat arrived in time: it is not expelled for the wait")

	var last time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT last_heartbeat FROM streamd.consumer_registrations
		WHERE stream_name = $1 AND group_id = $2 AND consumer_id = $3`, stream, group, m.consumerID).Scan(&last))
	require.False(t, last.Before(released), "m's session restarts after the wait: %v, row released at %v", last, released)
	require.False(t, registered(t, pool, stream, group, dead.consumerID), "dead was expired")
	require.False(t, registered(t, pool, stream, group, other.consumerID), "other's session ran out during the wait: expired")
}

// TestCommitTxJudgesTheSessionAtTheCall (the clock rule): CommitTx in a transaction
// that began while its member was live, called after the session ran out, is fenced.
// The check used now(), the start of the handler's transaction, and accepted it.
func TestCommitTxJudgesTheSessionAtTheCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 1)
	m, err := memberJoin(ctx, pool, stream, group, "m", "", time.Second, time.Minute, nil)
	require.NoError(t, err)
	_, err = m.heartbeat(ctx, pool, nil)
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1") // the handler's first write, while m is live
	require.NoError(t, err)
	waitFor(t, 5*time.Second, "m's session expired", func() bool { return sessionExpired(t, pool, stream, group, m.consumerID) })
	require.ErrorIs(t, m.commitBatch(ctx, tx, 0, 0, 1, nil), ErrFenced)
}

// TestCommitTxCheckedAgainAtCommit: a CommitTx transaction that outlives its member's
// session (nobody expired the member yet: no other member, no reaper) is refused at
// COMMIT and writes nothing; one whose member keeps heartbeating commits however long
// it stays open.
func TestCommitTxCheckedAgainAtCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 2)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 10)
	// 3 s: the live phase heartbeats from the test's polling loop, whose gaps a loaded
	// machine (make test at load 18) stretched past a 1 s session.
	const session = 3 * time.Second
	m, err := memberJoin(ctx, pool, stream, group, "m", "", session, time.Minute, nil)
	require.NoError(t, err)
	asg, err := m.heartbeat(ctx, pool, nil)
	require.NoError(t, err)
	require.Equal(t, []int32{0, 1}, asg.Assigned)

	// Live throughout: heartbeats go on while the transaction stays open past the
	// session timeout.
	live := openCommitTx(t, pool, m, 0, 0)
	var opened time.Time
	require.NoError(t, live.QueryRow(ctx, "SELECT now()").Scan(&opened))
	waitFor(t, 3*session, "the transaction outlived one session timeout", func() bool {
		_, err := m.heartbeat(ctx, pool, nil)
		require.NoError(t, err)
		var past bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp() > $1::timestamptz + $2::interval",
			opened, session+200*time.Millisecond).Scan(&past))
		return past
	})
	require.NoError(t, live.Commit(ctx), "a live member's long transaction commits")

	// Silent: the session runs out while the transaction is open.
	frozen := openCommitTx(t, pool, m, 1, 0)
	waitFor(t, 3*session, "m's session expired", func() bool { return sessionExpired(t, pool, stream, group, m.consumerID) })
	requireRefusedAtCommit(t, frozen)
	_, ok, err := committedOffset(ctx, pool, stream, group, 1)
	require.NoError(t, err)
	require.False(t, ok)
}

// TestHeartbeatPastRebalanceTimeoutIsFenced: a member that kept a partition another
// member waits for past its rebalance timeout is fenced by its own heartbeat (whose
// expiry pass expels it), not handed an empty assignment as if it were still a member:
// the heartbeat refreshes its own session before it expires the others (the clock
// rule), so it must look again after.
func TestHeartbeatPastRebalanceTimeoutIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 2)
	group := testdb.Name("g")
	a, err := memberJoin(ctx, pool, stream, group, "a", "", testSession, 50*time.Millisecond, nil)
	require.NoError(t, err)
	asg, err := a.heartbeat(ctx, pool, nil)
	require.NoError(t, err)
	require.Equal(t, []int32{0, 1}, asg.Assigned)
	join(t, pool, stream, group, "b")
	waitFor(t, 5*time.Second, "a kept the promised partition past its rebalance timeout", func() bool {
		var past bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM streamd.consumer_partitions
			WHERE stream_name = $1 AND group_id = $2 AND target_since + interval '50 milliseconds' < clock_timestamp())`,
			stream, group).Scan(&past))
		return past
	})
	_, err = a.heartbeat(ctx, pool, nil)
	require.ErrorIs(t, err, ErrFenced)
}

// TestOffsetsWrittenInPlainSQLAreNotChecked: the check at COMMIT applies to the
// transactions of commit_batch and commit_offsets only; a SQL client that writes
// consumer_offsets itself under a consumer id that is no registered member (as seed
// 003's clients and the retention tests do) commits as before.
func TestOffsetsWrittenInPlainSQLAreNotChecked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	_, err := pool.Exec(ctx, "INSERT INTO streamd.consumer_groups (stream_name, group_id) VALUES ($1, $2)", stream, group)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO streamd.consumer_offsets (stream_name, group_id, partition, "offset", consumer_id, member_epoch)
		VALUES ($1, $2, 0, 0, 'nobody', 1)`, stream, group)
	require.NoError(t, err)
	off, ok, err := committedOffset(ctx, pool, stream, group, 0)
	require.NoError(t, err)
	require.True(t, ok)
	require.Zero(t, off)
}
