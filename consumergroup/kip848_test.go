package consumergroup

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

func owned(res *ConsumerHeartbeatResult) []StreamPartition { return res.Assignment }

// TestKIP848MembersShareTheNativeGroup: KIP-848 members join the stream's native group
// and get the server-side sticky assignment incrementally: a partition moves only after
// its owner reports it no longer owns it; a commit of a revoked partition is
// STALE_MEMBER_EPOCH and one with another epoch FENCED_MEMBER_EPOCH, both writing
// nothing; a native Go member shares the group; a classic member cannot join it.
func TestKIP848MembersShareTheNativeGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := NewClassic(pool, &ClassicConfig{ConsumerSessionTimeout: 10 * time.Second})
	require.NoError(t, err)
	stream := newStream(t, pool, 4)
	produceN(t, pool, stream, 0, 5)
	group := testdb.Name("kg")

	a, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", Topics: []string{stream}})
	require.NoError(t, err)
	require.Positive(t, a.MemberEpoch)
	require.Len(t, owned(a), 4)

	b, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "b", Topics: []string{stream}})
	require.NoError(t, err)
	require.Empty(t, owned(b), "nothing moves before its owner let it go")

	// A is told to keep two; until it says it let the others go, it still owns them.
	a2, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", MemberEpoch: a.MemberEpoch})
	require.NoError(t, err)
	require.Len(t, owned(a2), 2)
	kept := map[int32]bool{}
	for _, p := range owned(a2) {
		kept[p.Partition] = true
	}
	var revoked int32 = -1
	for p := int32(0); p < 4; p++ {
		if !kept[p] {
			revoked = p
		}
	}
	res, err := c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: "a", Generation: a.MemberEpoch,
		Offsets: []StreamOffset{{Stream: stream, Partition: revoked, Offset: 0}}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err, "a revoking member commits before it lets go")

	_, err = c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", MemberEpoch: a.MemberEpoch,
		Owned: owned(a2), OwnedKnown: true})
	require.NoError(t, err)
	b2, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "b", MemberEpoch: b.MemberEpoch})
	require.NoError(t, err)
	require.Len(t, owned(b2), 2)

	produceN(t, pool, stream, revoked, 3)
	res, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: "a", Generation: a.MemberEpoch,
		Offsets: []StreamOffset{{Stream: stream, Partition: revoked, Offset: 2}}})
	require.NoError(t, err)
	require.ErrorIs(t, res[0].Err, ErrStaleMemberEpoch)
	res, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: "b", Generation: b.MemberEpoch + 7,
		Offsets: []StreamOffset{{Stream: stream, Partition: revoked, Offset: 2}}})
	require.NoError(t, err)
	require.ErrorIs(t, res[0].Err, ErrFenced)
	require.Equal(t, map[int32]int64{revoked: 0}, committed(t, c, group, stream), "refused commits wrote nothing")
	res, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: "b", Generation: b.MemberEpoch,
		Offsets: []StreamOffset{{Stream: stream, Partition: revoked, Offset: 2}}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)

	_, err = c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", MemberEpoch: a.MemberEpoch + 1})
	require.ErrorIs(t, err, ErrFenced)
	_, err = c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "nobody", MemberEpoch: 3})
	require.ErrorIs(t, err, ErrUnknownMember)
	_, err = c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "x"})
	require.ErrorIs(t, err, ErrInvalidArgument, "a join subscribes to something")

	// A native Go member joins the same group; a classic member cannot.
	native := join(t, pool, stream, group, "native-1")
	require.NotZero(t, native.epoch)
	_, err = c.Join(ctx, classicJoin(group, "", ""))
	require.ErrorIs(t, err, ErrInconsistentGroupProtocol)

	// A leaves: its partitions go to the others.
	left, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", MemberEpoch: -1})
	require.NoError(t, err)
	require.Equal(t, int32(-1), left.MemberEpoch)
	d, err := NewAdmin(pool).DescribeGroup(ctx, stream, group)
	require.NoError(t, err)
	require.Len(t, d.MemberStatus, 2)
}

// partitionsOf counts an assignment's partitions per stream.
func partitionsOf(a []StreamPartition) map[string]int {
	out := map[string]int{}
	for _, p := range a {
		out[p.Stream]++
	}
	return out
}

// TestKIP848MemberSubscribesToSeveralStreams: a KIP-848 member subscribes to a topic
// list (one of which does not exist yet) and another to a regex; each has one member
// epoch across the streams; partitions of both streams are split between them, moving
// only once their owner let them go; a stream created later that a name or the regex
// matches is joined at the next heartbeat; commits are fenced per partition with the
// one epoch (STALE_MEMBER_EPOCH for a partition it does not own, on any stream,
// FENCED_MEMBER_EPOCH for another epoch) and write nothing when refused; a leave hands
// every stream's partitions over.
func TestKIP848MemberSubscribesToSeveralStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := NewClassic(pool, &ClassicConfig{ConsumerSessionTimeout: 10 * time.Second})
	require.NoError(t, err)
	prefix := testdb.Name("kre")
	s1, s2, later, other := prefix+"-a", prefix+"-b", prefix+"-later", testdb.Name("kother")
	client := streams.NewClient(pool, nil)
	require.NoError(t, client.CreateStream(ctx, s1, 2))
	require.NoError(t, client.CreateStream(ctx, s2, 3))
	require.NoError(t, client.CreateStream(ctx, other, 1))
	for p := int32(0); p < 3; p++ {
		if p < 2 {
			produceN(t, pool, s1, p, 3)
		}
		produceN(t, pool, s2, p, 3)
	}
	group := testdb.Name("kg")
	hb := func(id string, epoch int32, owned []StreamPartition) *ConsumerHeartbeatResult {
		t.Helper()
		res, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: id, MemberEpoch: epoch,
			Owned: owned, OwnedKnown: owned != nil})
		require.NoError(t, err)
		require.Equal(t, epoch, res.MemberEpoch, "the member epoch stays the same across streams and heartbeats")
		return res
	}

	a, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", Topics: []string{s1, s2, later}})
	require.NoError(t, err)
	require.Positive(t, a.MemberEpoch)
	require.Equal(t, map[string]int{s1: 2, s2: 3}, partitionsOf(a.Assignment), "a subscription of two streams")

	regex := prefix + "-.*"
	b, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "b", Topics: []string{}, Regex: &regex})
	require.NoError(t, err)
	require.Greater(t, b.MemberEpoch, a.MemberEpoch)
	require.Empty(t, b.Assignment, "nothing moves before its owner let it go")

	// A keeps its share of both streams and reports it let the rest go.
	a2 := hb("a", a.MemberEpoch, nil)
	require.Len(t, a2.Assignment, 3, "5 partitions over 2 members: a keeps one stream's share of each")
	hb("a", a.MemberEpoch, a2.Assignment)
	b2 := hb("b", b.MemberEpoch, nil)
	require.Len(t, b2.Assignment, 2)
	require.Len(t, partitionsOf(append(append([]StreamPartition{}, a2.Assignment...), b2.Assignment...)), 2)
	for _, p := range b2.Assignment {
		require.NotContains(t, a2.Assignment, p, "no partition has two owners")
	}

	// Commits: each member commits what it owns with its one epoch, on either stream.
	commit := func(id string, epoch int32, p StreamPartition, off int64) error {
		t.Helper()
		res, err := c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: id, Generation: epoch,
			Offsets: []StreamOffset{{Stream: p.Stream, Partition: p.Partition, Offset: off}}})
		require.NoError(t, err)
		return res[0].Err
	}
	for _, p := range a2.Assignment {
		require.NoError(t, commit("a", a.MemberEpoch, p, 0))
	}
	for _, p := range b2.Assignment {
		require.NoError(t, commit("b", b.MemberEpoch, p, 0))
	}
	bp := b2.Assignment[0]
	require.ErrorIs(t, commit("a", a.MemberEpoch, bp, 1), ErrStaleMemberEpoch, "a partition it gave up")
	require.ErrorIs(t, commit("b", b.MemberEpoch+1, bp, 1), ErrFenced, "another epoch")
	require.ErrorIs(t, commit("b", a.MemberEpoch, bp, 1), ErrFenced, "a's epoch is not b's")
	require.ErrorIs(t, commit("a", a.MemberEpoch, StreamPartition{Stream: other, Partition: 0}, 0), ErrStaleMemberEpoch,
		"a stream outside its subscription")
	require.Equal(t, int64(0), committed(t, c, group, bp.Stream)[bp.Partition], "refused commits wrote nothing")
	require.Empty(t, committed(t, c, group, other))

	// A stream created later joins the subscriptions that name or match it.
	require.NoError(t, client.CreateStream(ctx, later, 2))
	// Each heartbeat reports what the last one assigned (the client let the rest go).
	a3, b3 := a2, b2
	var total map[string]int
	for round := 0; round < 4; round++ {
		a3 = hb("a", a.MemberEpoch, a3.Assignment)
		b3 = hb("b", b.MemberEpoch, b3.Assignment)
		total = partitionsOf(append(append([]StreamPartition{}, a3.Assignment...), b3.Assignment...))
		if total[later] == 2 && len(b3.Assignment) == 3 {
			break
		}
	}
	require.Equal(t, map[string]int{s1: 2, s2: 3, later: 2}, total, "the new stream is assigned")
	require.Positive(t, partitionsOf(b3.Assignment)[later]+partitionsOf(a3.Assignment)[later])
	require.Len(t, a3.Assignment, 4)
	require.Len(t, b3.Assignment, 3)

	// Bad input.
	bad := "("
	_, err = c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "c", Topics: []string{}, Regex: &bad})
	require.ErrorIs(t, err, ErrInvalidRegularExpression)
	_, err = c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", MemberEpoch: a.MemberEpoch + 1})
	require.ErrorIs(t, err, ErrFenced)
	_, err = c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "nobody", MemberEpoch: 3})
	require.ErrorIs(t, err, ErrUnknownMember)

	// A classic member cannot join; A leaves: B gets every partition of every stream.
	_, err = c.Join(ctx, classicJoin(group, "", ""))
	require.ErrorIs(t, err, ErrInconsistentGroupProtocol)
	_, err = c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", MemberEpoch: -1})
	require.NoError(t, err)
	b4 := hb("b", b.MemberEpoch, b3.Assignment)
	require.Equal(t, map[string]int{s1: 2, s2: 3, later: 2}, partitionsOf(b4.Assignment))
	require.ErrorIs(t, commit("a", a.MemberEpoch, b4.Assignment[0], 0), ErrUnknownMember, "a left")

	d, err := c.DescribeConsumerGroup(ctx, group)
	require.NoError(t, err)
	require.Len(t, d.Members, 1)
	require.Equal(t, int64(b.MemberEpoch), d.Members[0].MemberEpoch)
	require.ElementsMatch(t, []string{s1, s2, later}, d.Members[0].Streams)
	require.Equal(t, regex, d.Members[0].Regex)
}

// TestKIP848VirtualTopicsGoToOneMember: a virtual topic (the Kafka listener's internal
// topic) that subscriptions name or match is split among the members that take it in,
// each partition to one of them; a member whose subscription does not take it gets none.
func TestKIP848VirtualTopicsGoToOneMember(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := NewClassic(pool, &ClassicConfig{ConsumerSessionTimeout: 10 * time.Second})
	require.NoError(t, err)
	stream, group := newStream(t, pool, 1), testdb.Name("kg")
	virtual := map[string]int32{"__virtual": 3}
	regex := ".*virt.*"
	join := func(id string, topics []string, regex *string) *ConsumerHeartbeatResult {
		res, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: id, Topics: topics, Regex: regex, Virtual: virtual})
		require.NoError(t, err)
		return res
	}
	a := join("a", []string{}, &regex)
	require.Equal(t, map[string]int{"__virtual": 3}, partitionsOf(a.Assignment), "alone, it takes every partition")
	epochs := map[string]int32{"a": a.MemberEpoch}
	epochs["b"] = join("b", []string{"__virtual"}, nil).MemberEpoch
	epochs["c"] = join("c", []string{stream}, nil).MemberEpoch
	got := map[string][]StreamPartition{}
	for id, epoch := range epochs {
		res, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: id, MemberEpoch: epoch, Virtual: virtual})
		require.NoError(t, err)
		got[id] = res.Assignment
	}
	require.Equal(t, []StreamPartition{{Stream: "__virtual", Partition: 0}, {Stream: "__virtual", Partition: 2}}, got["a"])
	require.Equal(t, []StreamPartition{{Stream: "__virtual", Partition: 1}}, got["b"])
	require.Equal(t, []StreamPartition{{Stream: stream, Partition: 0}}, got["c"])
}

// TestKIP848MemberCallsAreSerialized: a KIP-848 member's heartbeat and leave wait for
// each other (a session advisory lock of the member): a heartbeat that joins a new
// stream and a leave, released together, leave no native membership behind in either
// order.
func TestKIP848MemberCallsAreSerialized(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := NewClassic(pool, &ClassicConfig{ConsumerSessionTimeout: 10 * time.Second})
	require.NoError(t, err)
	s1, group := newStream(t, pool, 1), testdb.Name("kg")
	s2 := testdb.Name("cg")
	a, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", Topics: []string{s1, s2}})
	require.NoError(t, err)
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, s2, 1))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext($2))", kip848LockClass, group+"/a")
	require.NoError(t, err)
	errs := make(chan error, 2)
	go func() {
		_, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", MemberEpoch: a.MemberEpoch})
		errs <- err
	}()
	testdb.WaitForLockWait(t, pool, tx, "pg_advisory_lock")
	go func() {
		_, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", MemberEpoch: -1})
		errs <- err
	}()
	require.NoError(t, tx.Rollback(ctx))
	for range 2 {
		if err := <-errs; err != nil {
			require.ErrorIs(t, err, ErrUnknownMember, "a heartbeat after the leave")
		}
	}
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.consumer_registrations
		WHERE group_id = $1 AND consumer_id = 'a'`, group).Scan(&left))
	require.Zero(t, left, "no membership is left behind")
}

// TestReplacedKIP848MemberCannotCommitThroughItsLeftoverMembership (G4): a static
// KIP-848 member replaced by a restart with its instance id loses its member row at
// once, while its native membership of a stream the new member does not take in
// lives on until its session ends. A commit from the replaced member is refused as an
// unknown member and writes nothing, even with a generation equal to that
// membership's native epoch (both counters start at 1): it used to be compared with
// it, and committed.
func TestReplacedKIP848MemberCannotCommitThroughItsLeftoverMembership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	produce(t, pool, stream, 0, 5)
	group := testdb.Name("g")
	var kafkaEpoch, nativeEpoch int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT streamd.kafka_consumer_join($1, 'x', 'inst', ARRAY[$2], NULL, 60000, 60000, NULL)`,
		group, stream).Scan(&kafkaEpoch))
	require.NoError(t, pool.QueryRow(ctx, `SELECT streamd.join_group($1, $2, 'x', 'inst', 60000, 60000, NULL)`,
		stream, group).Scan(&nativeEpoch))
	var owner string
	require.NoError(t, pool.QueryRow(ctx, `SELECT owner_id FROM streamd.consumer_partitions
		WHERE stream_name = $1 AND group_id = $2 AND partition = 0`, stream, group).Scan(&owner))
	require.Equal(t, "x", owner)

	// y restarts the instance and subscribes to nothing: x's row goes, its membership stays.
	_, err := pool.Exec(ctx, `SELECT streamd.kafka_consumer_join($1, 'y', 'inst', '{}', NULL, 60000, 60000, NULL)`, group)
	require.NoError(t, err)
	require.True(t, registered(t, pool, stream, group, "x"), "the native membership outlives the member row")

	var outcome string
	require.NoError(t, pool.QueryRow(ctx, `SELECT outcome FROM streamd.kafka_group_commit($1, 'x', NULL, $2::integer,
		ARRAY[$3], ARRAY[0], ARRAY[3::bigint], ARRAY[NULL::text], NULL)`, group, nativeEpoch, stream).Scan(&outcome))
	require.Equal(t, "unknown_member", outcome)
	_, ok, err := committedOffset(ctx, pool, stream, group, 0)
	require.NoError(t, err)
	require.False(t, ok, "nothing committed")
}

// TestKIP848SubscriptionResolvedOnlyOnChange: a KIP-848 regex subscription is compiled
// once per process and resolved against streamd.streams only when the subscription or
// the set of streams changed (a stream created, a subscription changed), not at every
// heartbeat; members sharing a subscription share its resolution; the members' share
// of a virtual topic is counted without compiling the other members' regexes. The
// heartbeats still see a stream created later and split the virtual topic as before.
func TestKIP848SubscriptionResolvedOnlyOnChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := NewClassic(pool, &ClassicConfig{ConsumerSessionTimeout: 10 * time.Second})
	require.NoError(t, err)
	prefix, group := testdb.Name("rx"), testdb.Name("kg")
	client := streams.NewClient(pool, nil)
	require.NoError(t, client.CreateStream(ctx, prefix+"-a", 2))
	virtual := map[string]int32{"__virtual": 2}
	regex := "^(?:" + prefix + "-.*|__virtual)$"
	epochs := map[string]int32{}
	beat := func(id string, r *string, topics ...string) *ConsumerHeartbeatResult {
		t.Helper()
		req := &ConsumerHeartbeat{Group: group, MemberID: id, MemberEpoch: epochs[id], Regex: r, Virtual: virtual}
		if topics != nil {
			req.Topics = topics
		}
		res, err := c.ConsumerHeartbeat(ctx, req)
		require.NoError(t, err)
		epochs[id] = res.MemberEpoch
		return res
	}
	counts := func() (compiles, resolves int64) { return c.subs.compiles.Load(), c.subs.resolves.Load() }
	// Other tests create streams in the same database meanwhile, and each one changes
	// the stream set's version: a run of heartbeats may resolve again at most once per
	// change it saw (a and b share one subscription), never once per heartbeat.
	version := func() int64 {
		var v int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT version FROM streamd.stream_set_version").Scan(&v))
		return v
	}
	steady := func(what string, beats func()) {
		t.Helper()
		_, r0 := counts()
		v0 := version()
		beats()
		_, r1 := counts()
		require.LessOrEqual(t, r1-r0, version()-v0, what)
	}

	beat("a", &regex)
	steady("b shares a's resolution", func() { beat("b", &regex) })
	compiles, _ := counts()
	require.Equal(t, int64(1), compiles, "one regex, compiled once")
	steady("heartbeats resolve nothing again", func() {
		for range 5 {
			beat("a", nil)
			beat("b", nil)
		}
	})

	// A stream created later: resolved again, and joined.
	_, before := counts()
	require.NoError(t, client.CreateStream(ctx, prefix+"-b", 2))
	beat("a", nil)
	res := beat("b", nil)
	_, after := counts()
	require.Greater(t, after, before, "the stream set changed: resolved again")
	require.Contains(t, partitionsOf(res.Assignment), "__virtual")
	a := beat("a", nil)
	require.Equal(t, 1, partitionsOf(a.Assignment)["__virtual"], "a and b split the virtual topic")
	d, err := c.DescribeConsumerGroup(ctx, group)
	require.NoError(t, err)
	for _, m := range d.Members {
		require.Equal(t, []string{prefix + "-a", prefix + "-b"}, m.Streams, "member %s", m.MemberID)
	}

	// A member with another regex: compiled once; the others' heartbeats do not compile
	// it, nor does its own compile theirs.
	only := "^__virtual$"
	beat("c", &only)
	for range 3 {
		beat("a", nil)
		beat("b", nil)
		beat("c", nil)
	}
	compiles, _ = counts()
	require.Equal(t, int64(2), compiles)
	got := map[string]int{}
	for _, id := range []string{"a", "b", "c"} {
		got[id] = partitionsOf(beat(id, nil).Assignment)["__virtual"]
	}
	require.Equal(t, map[string]int{"a": 1, "b": 1, "c": 0}, got, "partition i to the (i mod 3)-th taker by id")

	// A subscription changed by a heartbeat is resolved again.
	_, before = counts()
	beat("a", nil, prefix+"-a")
	_, after = counts()
	require.Greater(t, after, before)
}

// TestLRUForgetsTheLeastRecentlyUsed: the subscription caches are bounded.
func TestLRUForgetsTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	l := newLRU[string, int](2)
	l.put("a", 1)
	l.put("b", 2)
	_, _ = l.get("a")
	l.put("c", 3)
	require.Equal(t, 2, l.len())
	_, ok := l.get("b")
	require.False(t, ok, "b was the least recently used")
	v, ok := l.get("a")
	require.True(t, ok)
	require.Equal(t, 1, v)
}
