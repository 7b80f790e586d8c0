package consumergroup

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// slowHook stands for a hook's real work (warming a cache, flushing state) that
// takes longer than testConfig's SessionTimeout (1.5s).
const slowHook = 2 * time.Second

// TestSlowOnAssignedKeepsTheMembership: an OnAssigned hook slower than SessionTimeout
// (but within MaxPollInterval) does not get its member expelled: heartbeats go on
// while it runs. They came only from the session loop that runs the hook, so the
// member was expelled, rejoined, ran the hook again and was expelled again, forever,
// processing nothing. The hook's ctx ends at MaxPollInterval.
func TestSlowOnAssignedKeepsTheMembership(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 5)
	cfg := testConfig(stream, group)
	cfg.MaxPollInterval = time.Minute
	var assigned, lost atomic.Int32
	var deadlineOK atomic.Bool
	cfg.OnAssigned = func(ctx context.Context, _ Membership, _ []int32) {
		assigned.Add(1)
		dl, ok := ctx.Deadline()
		deadlineOK.Store(ok && time.Until(dl) <= cfg.MaxPollInterval)
		time.Sleep(slowHook) // the hook's work, not a wait for a condition
	}
	cfg.OnLost = func(context.Context, Membership, []int32) { lost.Add(1) }
	c, err := New(pool, cfg)
	require.NoError(t, err)
	runConsumer(t, c, func(context.Context, *Batch) error { return nil })
	waitFor(t, 10*time.Second, "every event committed", func() bool { return groupLag(t, pool, stream, group) == 0 })
	require.EqualValues(t, 1, assigned.Load(), "OnAssigned ran once: the member was never expelled")
	require.Zero(t, lost.Load())
	require.True(t, deadlineOK.Load(), "the hook's ctx ends within MaxPollInterval")
}

// TestSlowOnRevokedKeepsTheMembership: an OnRevoked hook slower than SessionTimeout,
// run when a second member joins, does not get its member expelled: heartbeats go on
// while it runs, the partition is handed over cleanly (OnRevoked, not OnLost) and the
// member keeps the other one.
func TestSlowOnRevokedKeepsTheMembership(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 2)
	group := testdb.Name("g")
	cfgA := testConfig(stream, group)
	var revoked, lost atomic.Int32
	cfgA.OnRevoked = func(context.Context, Membership, []int32) {
		revoked.Add(1)
		time.Sleep(slowHook) // the hook's work, not a wait for a condition
	}
	cfgA.OnLost = func(context.Context, Membership, []int32) { lost.Add(1) }
	a, err := New(pool, cfgA)
	require.NoError(t, err)
	runConsumer(t, a, func(context.Context, *Batch) error { return nil })
	waitFor(t, 5*time.Second, "a owns both", func() bool { return len(a.Assignment()) == 2 })
	b, err := New(pool, testConfig(stream, group))
	require.NoError(t, err)
	runConsumer(t, b, func(context.Context, *Batch) error { return nil })
	waitFor(t, 10*time.Second, "one partition each", func() bool {
		return len(a.Assignment()) == 1 && len(b.Assignment()) == 1 && revoked.Load() == 1
	})
	// a's next heartbeats, after the hook returned, find it still a member.
	waitFor(t, 5*time.Second, "a's registration seen live after the hook", func() bool {
		var live bool
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) = 2 FROM streamd.consumer_registrations
			WHERE stream_name = $1 AND group_id = $2 AND last_heartbeat > now() - interval '500 milliseconds'`, stream, group).Scan(&live))
		return live
	})
	require.Zero(t, lost.Load(), "a was never expelled")
	require.EqualValues(t, 1, revoked.Load())
}

// TestFencedDuringOnAssignedStartsNoWorkers: when the membership ends while OnAssigned
// runs (here its epoch is moved by hand, as a forced reset or an expiry would), the
// heartbeats that run meanwhile are refused, and the partitions it was given are not
// processed under that membership: the member heartbeats at once, is refused, and
// rejoins. Their workers used to start and run handlers (whose commits were then
// refused) until the session loop's next heartbeat.
func TestFencedDuringOnAssignedStartsNoWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 5)
	cfg := testConfig(stream, group)
	cfg.HeartbeatInterval = time.Second // the session loop's next heartbeat comes late
	var fencedEpoch atomic.Int64
	var first atomic.Bool
	first.Store(true)
	cfg.OnAssigned = func(context.Context, Membership, []int32) {
		if !first.CompareAndSwap(true, false) {
			return
		}
		var epoch int64
		err := pool.QueryRow(ctx, `UPDATE streamd.consumer_registrations SET member_epoch = member_epoch + 1000
			WHERE stream_name = $1 AND group_id = $2 RETURNING member_epoch - 1000`, stream, group).Scan(&epoch)
		if err != nil {
			t.Errorf("fence the member: %v", err)
		}
		fencedEpoch.Store(epoch)
		time.Sleep(2 * cfg.HeartbeatInterval) // a heartbeat runs, and is refused
	}
	c, err := New(pool, cfg)
	require.NoError(t, err)
	var underFenced atomic.Int32
	runConsumer(t, c, func(_ context.Context, b *Batch) error {
		if b.MemberEpoch == fencedEpoch.Load() {
			underFenced.Add(1)
		}
		return nil
	})
	waitFor(t, 15*time.Second, "every event committed after the rejoin", func() bool { return groupLag(t, pool, stream, group) == 0 })
	require.Zero(t, underFenced.Load(), "batches handled under the membership that ended during OnAssigned")
}
