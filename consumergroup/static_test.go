package consumergroup

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// staticConsumer returns a Consumer of the group with instance id "host-a".
func staticConsumer(t *testing.T, stream, group string, lost *atomic.Int32, hooks *testHooks) *Consumer {
	t.Helper()
	cfg := testConfig(stream, group)
	cfg.InstanceID = "host-a"
	cfg.hooks = hooks
	if lost != nil {
		cfg.OnLost = func(_ context.Context, _ Membership, ps []int32) { lost.Add(int32(len(ps))) }
	}
	c, err := New(testdb.Pool(t), cfg)
	require.NoError(t, err)
	return c
}

// groupEpoch is the group's epoch, which every membership change bumps.
func groupEpoch(t *testing.T, stream, group string) int64 {
	t.Helper()
	var epoch int64
	require.NoError(t, testdb.Pool(t).QueryRow(context.Background(), `SELECT group_epoch FROM streamd.consumer_groups
		WHERE stream_name = $1 AND group_id = $2`, stream, group).Scan(&epoch))
	return epoch
}

// TestDuplicateInstanceIDStopsTheFencedConsumer: two running Consumers configured
// with one InstanceID (a misconfiguration, or a rolling deploy whose new process
// starts before the old one stopped). The second one's join takes the instance over;
// the first is fenced and its Run returns ErrInstanceFenced (also ErrFenced) instead
// of joining again: each rejoin took the partitions back and fenced the other, forever,
// both handling the same partitions meanwhile. The second keeps them.
func TestDuplicateInstanceIDStopsTheFencedConsumer(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 2)
	group := testdb.Name("g")
	var lostA atomic.Int32
	a := staticConsumer(t, stream, group, &lostA, nil)
	h := func(context.Context, *Batch) error { return nil }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errA := make(chan error, 1)
	go func() { errA <- a.Run(ctx, h) }()
	waitFor(t, 5*time.Second, "a owns both", func() bool { return len(a.Assignment()) == 2 })

	b := staticConsumer(t, stream, group, nil, nil)
	runConsumer(t, b, h)
	select {
	case err := <-errA:
		require.ErrorIs(t, err, ErrInstanceFenced)
		require.ErrorIs(t, err, ErrFenced)
	case <-time.After(10 * time.Second):
		t.Fatal("a did not stop after b took its instance id over")
	}
	require.EqualValues(t, 2, lostA.Load(), "a reported its partitions lost")
	waitFor(t, 5*time.Second, "b owns both", func() bool { return len(b.Assignment()) == 2 })
	epoch := groupEpoch(t, stream, group)
	// Nobody rejoins any more: a few heartbeat intervals later the membership is the same.
	time.Sleep(3 * testConfig(stream, group).HeartbeatInterval) // asserting that nothing happens
	require.Equal(t, epoch, groupEpoch(t, stream, group), "the membership settled")
	require.Equal(t, []int32{0, 1}, b.Assignment())
}

// TestStaticMemberRestarts: the legitimate uses of an instance id still work. A
// restart after a clean exit (a static member does not leave) takes the partitions
// back; a static member frozen past its session timeout, whose partitions went to
// another member meanwhile, finds nobody holding its instance id and joins again.
func TestStaticMemberRestarts(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 2)
	group := testdb.Name("g")
	h := func(context.Context, *Batch) error { return nil }

	first := staticConsumer(t, stream, group, nil, nil)
	stop := runConsumer(t, first, h)
	waitFor(t, 5*time.Second, "the first process owns both", func() bool { return len(first.Assignment()) == 2 })
	require.NoError(t, stop())

	var lost atomic.Int32
	thaw := make(chan struct{})
	var frozen atomic.Bool
	restarted := staticConsumer(t, stream, group, &lost, &testHooks{beforeHeartbeat: func() {
		if frozen.Load() {
			<-thaw
		}
	}})
	stopRestarted := runConsumer(t, restarted, h)
	waitFor(t, 5*time.Second, "the restart owns both", func() bool { return len(restarted.Assignment()) == 2 })

	frozen.Store(true)
	other, err := New(pool, testConfig(stream, group))
	require.NoError(t, err)
	runConsumer(t, other, h)
	waitFor(t, 10*time.Second, "the other member owns both after the frozen one expired", func() bool {
		return len(other.Assignment()) == 2
	})
	close(thaw)
	waitFor(t, 10*time.Second, "the thawed member joined again", func() bool {
		return len(restarted.Assignment()) == 1 && len(other.Assignment()) == 1
	})
	require.EqualValues(t, 2, lost.Load())
	require.NoError(t, stopRestarted(), "Run ends with nil at cancel: it was never told its instance id was taken")
}
