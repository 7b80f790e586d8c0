package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// classicClock is a settable clock for a Classic coordinator: every call passes its
// time to the SQL, so a test moves time forward instead of sleeping.
type classicClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *classicClock) get() *time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.now
	return &t
}

func (c *classicClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newClassic(t *testing.T, pool *pgxpool.Pool) (*Classic, *classicClock) {
	t.Helper()
	c, err := NewClassic(pool, &ClassicConfig{PollInterval: 5 * time.Millisecond})
	require.NoError(t, err)
	clock := &classicClock{now: time.Now()}
	c.now = clock.get
	return c, clock
}

func classicJoin(group, memberID, instanceID string, protocols ...string) *ClassicJoin {
	if len(protocols) == 0 {
		protocols = []string{"range"}
	}
	j := &ClassicJoin{Group: group, MemberID: memberID, InstanceID: instanceID, ClientID: "test",
		SessionTimeout: 10 * time.Second, RebalanceTimeout: 20 * time.Second, ProtocolType: "consumer"}
	for _, p := range protocols {
		j.Protocols = append(j.Protocols, ClassicProtocol{Name: p, Metadata: []byte(memberID + "/" + p)})
	}
	return j
}

type joinResult struct {
	g   *ClassicGeneration
	err error
}

// startJoin runs a Join in the background (it blocks until the rebalance completes).
func startJoin(c *Classic, req *ClassicJoin) <-chan joinResult {
	ch := make(chan joinResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		g, err := c.Join(ctx, req)
		ch <- joinResult{g, err}
	}()
	return ch
}

func awaitJoin(t *testing.T, ch <-chan joinResult) *ClassicGeneration {
	t.Helper()
	r := <-ch
	require.NoError(t, r.err)
	return r.g
}

// joinAlone joins a new dynamic member to a group and returns its generation.
func joinAlone(t *testing.T, c *Classic, group string) *ClassicGeneration {
	t.Helper()
	g, err := c.Join(context.Background(), classicJoin(group, "", ""))
	require.NoError(t, err)
	return g
}

// syncLeader stores the leader's assignment (each member gets its id as bytes).
func syncLeader(t *testing.T, c *Classic, group string, g *ClassicGeneration) {
	t.Helper()
	var as []ClassicAssignment
	for _, m := range g.Members {
		as = append(as, ClassicAssignment{MemberID: m.MemberID, Assignment: []byte("for " + m.MemberID)})
	}
	res, err := c.Sync(context.Background(), &ClassicSync{Group: group, MemberID: g.MemberID, Generation: g.Generation, Assignments: as})
	require.NoError(t, err)
	require.Equal(t, "for "+g.MemberID, string(res.Assignment))
}

func committed(t *testing.T, c *Classic, group, stream string) map[int32]int64 {
	t.Helper()
	offs, err := c.FetchOffsets(context.Background(), group, []string{stream})
	require.NoError(t, err)
	out := map[int32]int64{}
	for _, o := range offs {
		out[o.Partition] = o.Offset
	}
	return out
}

// waitPolled waits until every member of the group has been seen at the clock's time
// or later (pending joins poll on their own), so a test advancing the clock does not
// outrun them. It returns at once when the rebalance completed meanwhile.
func waitPolled(t *testing.T, pool *pgxpool.Pool, group string, clock *classicClock) {
	t.Helper()
	require.Eventually(t, func() bool {
		var behind bool
		err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM streamd.kafka_group_members m
			JOIN streamd.kafka_groups g USING (group_id)
			WHERE m.group_id = $1 AND m.last_heartbeat < $2 AND g.state = 'PreparingRebalance')`, group, clock.get()).Scan(&behind)
		require.NoError(t, err)
		return !behind
	}, 10*time.Second, 2*time.Millisecond)
}

func produceN(t *testing.T, pool *pgxpool.Pool, stream string, partition int32, n int) {
	t.Helper()
	recs := make([]streams.Record, n)
	for i := range recs {
		recs[i] = streams.Record{Stream: stream, Partition: &partition, Data: []byte(`{}`)}
	}
	_, err := streams.NewClient(pool, nil).Produce(context.Background(), recs...)
	require.NoError(t, err)
}

// TestClassicJoinSyncAndRebalance: members joining at once form one generation with
// one leader, who alone gets the members and hands out the assignment; a third
// member starts a rebalance the others learn from their heartbeat, they may still
// commit with the old generation while rejoining, and once the new generation formed
// the old one's commits are refused (ILLEGAL_GENERATION) and write nothing.
func TestClassicJoinSyncAndRebalance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 3)
	produceN(t, pool, stream, 0, 10)
	c, _ := newClassic(t, pool)
	group := testdb.Name("kg")

	a := joinAlone(t, c, group)
	require.Equal(t, int32(1), a.Generation)
	require.Equal(t, a.MemberID, a.Leader)
	require.Len(t, a.Members, 1)
	syncLeader(t, c, group, a)
	require.NoError(t, c.Heartbeat(ctx, group, a.MemberID, "", 1))

	bj := startJoin(c, classicJoin(group, "", "", "roundrobin", "range"))
	// A learns of the rebalance from its heartbeat, and may commit meanwhile.
	require.Eventually(t, func() bool {
		return errors.Is(c.Heartbeat(ctx, group, a.MemberID, "", 1), ErrRebalanceInProgress)
	}, 10*time.Second, 5*time.Millisecond)
	res, err := c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: a.MemberID, Generation: 1,
		Offsets: []StreamOffset{{Stream: stream, Partition: 0, Offset: 4}}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)

	a2 := awaitJoin(t, startJoin(c, classicJoin(group, a.MemberID, "")))
	b := awaitJoin(t, bj)
	require.Equal(t, int32(2), a2.Generation)
	require.Equal(t, int32(2), b.Generation)
	require.Equal(t, a.MemberID, a2.Leader, "the leader stays the leader")
	require.Equal(t, "range", a2.Protocol, "the only protocol both support")
	require.Len(t, a2.Members, 2)
	require.Empty(t, b.Members, "only the leader gets the members")
	require.Equal(t, []byte("/range"), a2.Members[1].Metadata, "the metadata of the chosen protocol")

	// Between JoinGroup and SyncGroup commits wait for the assignment.
	_, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: b.MemberID, Generation: 2,
		Offsets: []StreamOffset{{Stream: stream, Partition: 0, Offset: 5}}})
	require.ErrorIs(t, err, ErrRebalanceInProgress)

	bs := make(chan error, 1)
	go func() {
		res, err := c.Sync(ctx, &ClassicSync{Group: group, MemberID: b.MemberID, Generation: 2})
		if err == nil && string(res.Assignment) != "for "+b.MemberID {
			err = fmt.Errorf("follower got %q", res.Assignment)
		}
		bs <- err
	}()
	syncLeader(t, c, group, a2)
	require.NoError(t, <-bs)

	// The old generation is fenced; nothing is written.
	_, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: a.MemberID, Generation: 1,
		Offsets: []StreamOffset{{Stream: stream, Partition: 0, Offset: 9}}})
	require.ErrorIs(t, err, ErrIllegalGeneration)
	require.ErrorIs(t, c.Heartbeat(ctx, group, a.MemberID, "", 1), ErrIllegalGeneration)
	require.Equal(t, map[int32]int64{0: 4}, committed(t, c, group, stream))

	// The current generation commits; per-partition refusals leave the rest committed.
	res, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: b.MemberID, Generation: 2,
		Offsets: []StreamOffset{
			{Stream: stream, Partition: 1, Offset: 0},
			{Stream: stream, Partition: 0, Offset: 11},
			{Stream: stream, Partition: 7, Offset: 0},
			{Stream: "no-such-stream", Partition: 0, Offset: 0},
			{Stream: stream, Partition: 0, Offset: 10},
		}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	require.ErrorIs(t, res[1].Err, streams.ErrOffsetOutOfRange)
	require.ErrorIs(t, res[2].Err, streams.ErrPartitionNotFound)
	require.ErrorIs(t, res[3].Err, streams.ErrPartitionNotFound)
	require.NoError(t, res[4].Err)
	require.Equal(t, map[int32]int64{0: 10, 1: 0}, committed(t, c, group, stream))

	// The offsets are the native groups' rows: the native admin sees lag 0 on
	// partition 0 and the group as a group of the stream.
	d, err := NewAdmin(pool).DescribeGroup(ctx, stream, group)
	require.NoError(t, err)
	require.Equal(t, int64(0), d.PartitionStatus[0].Lag)
	require.Equal(t, int64(10), *d.PartitionStatus[0].CommittedOffset)

	// Unknown members are refused.
	_, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: "nobody", Generation: 2,
		Offsets: []StreamOffset{{Stream: stream, Partition: 0, Offset: 1}}})
	require.ErrorIs(t, err, ErrUnknownMember)
	require.ErrorIs(t, c.Heartbeat(ctx, group, "nobody", "", 2), ErrUnknownMember)
	// An admin commit (no member, generation -1) is refused while the group has members.
	_, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, Generation: -1,
		Offsets: []StreamOffset{{Stream: stream, Partition: 0, Offset: 1}}})
	require.ErrorIs(t, err, ErrUnknownMember)
	require.Equal(t, map[int32]int64{0: 10, 1: 0}, committed(t, c, group, stream))
}

// TestClassicExpiryAndDeadline: a member that stops heartbeating is removed after its
// session timeout and the others rebalance; in a rebalance, a member that keeps
// heartbeating but does not rejoin is removed at the rebalance deadline, and the
// generation forms without it.
func TestClassicExpiryAndDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, clock := newClassic(t, pool)
	group := testdb.Name("kg")

	a := joinAlone(t, c, group)
	syncLeader(t, c, group, a)
	bj := startJoin(c, classicJoin(group, "", ""))
	require.Eventually(t, func() bool {
		return errors.Is(c.Heartbeat(ctx, group, a.MemberID, "", 1), ErrRebalanceInProgress)
	}, 10*time.Second, 5*time.Millisecond)
	// A heartbeats but never rejoins: past the rebalance timeout (20s; B's pending
	// join keeps B alive meanwhile) the generation forms without A.
	for i := 0; i < 5; i++ {
		clock.advance(5 * time.Second)
		_ = c.Heartbeat(ctx, group, a.MemberID, "", 1)
		waitPolled(t, pool, group, clock)
	}
	b := awaitJoin(t, bj)
	require.Equal(t, int32(2), b.Generation)
	require.Equal(t, b.MemberID, b.Leader)
	require.Len(t, b.Members, 1)
	require.ErrorIs(t, c.Heartbeat(ctx, group, a.MemberID, "", 1), ErrUnknownMember)
	syncLeader(t, c, group, b)

	// C joins; B rejoins; then B goes silent: past its session timeout C's heartbeat
	// finds the group rebalancing, and C alone forms the next generation.
	cj := startJoin(c, classicJoin(group, "", ""))
	require.Eventually(t, func() bool {
		return errors.Is(c.Heartbeat(ctx, group, b.MemberID, "", 2), ErrRebalanceInProgress)
	}, 10*time.Second, 5*time.Millisecond)
	b3 := awaitJoin(t, startJoin(c, classicJoin(group, b.MemberID, "")))
	cg := awaitJoin(t, cj)
	require.Equal(t, int32(3), cg.Generation)
	syncLeader(t, c, group, b3)
	_, err := c.Sync(ctx, &ClassicSync{Group: group, MemberID: cg.MemberID, Generation: 3})
	require.NoError(t, err)
	clock.advance(6 * time.Second)
	require.NoError(t, c.Heartbeat(ctx, group, cg.MemberID, "", 3))
	clock.advance(6 * time.Second)
	require.ErrorIs(t, c.Heartbeat(ctx, group, cg.MemberID, "", 3), ErrRebalanceInProgress, "B expired")
	c4 := awaitJoin(t, startJoin(c, classicJoin(group, cg.MemberID, "")))
	require.Equal(t, int32(4), c4.Generation)
	require.Equal(t, cg.MemberID, c4.Leader)
	require.Len(t, c4.Members, 1)

	// The last member leaving empties the group (a new generation with no one).
	errs, err := c.Leave(ctx, group, []ClassicLeaver{{MemberID: cg.MemberID}, {MemberID: "nobody"}})
	require.NoError(t, err)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrUnknownMember)
	d, err := c.DescribeKafkaGroup(ctx, group)
	require.NoError(t, err)
	require.Equal(t, "Empty", d.State)
	require.Equal(t, int32(5), d.Generation)
	require.Empty(t, d.Members)
}

// TestClassicStaticMembership: a static member restarting (same instance id, no member
// id) takes over its old membership under a new id without a rebalance and gets its
// assignment back; the old id is fenced (FENCED_INSTANCE_ID).
func TestClassicStaticMembership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, _ := newClassic(t, pool)
	group := testdb.Name("kg")

	leader := joinAlone(t, c, group)
	syncLeader(t, c, group, leader)
	sj := startJoin(c, classicJoin(group, "", "instance-1"))
	require.Eventually(t, func() bool {
		return errors.Is(c.Heartbeat(ctx, group, leader.MemberID, "", 1), ErrRebalanceInProgress)
	}, 10*time.Second, 5*time.Millisecond)
	leader2 := awaitJoin(t, startJoin(c, classicJoin(group, leader.MemberID, "")))
	s := awaitJoin(t, sj)
	syncLeader(t, c, group, leader2)
	res, err := c.Sync(ctx, &ClassicSync{Group: group, MemberID: s.MemberID, InstanceID: "instance-1", Generation: 2})
	require.NoError(t, err)
	require.Equal(t, "for "+s.MemberID, string(res.Assignment))

	// The restart: a new member id, the same generation, the old assignment.
	s2, err := c.Join(ctx, classicJoin(group, "", "instance-1"))
	require.NoError(t, err)
	require.NotEqual(t, s.MemberID, s2.MemberID)
	require.Equal(t, int32(2), s2.Generation)
	res, err = c.Sync(ctx, &ClassicSync{Group: group, MemberID: s2.MemberID, InstanceID: "instance-1", Generation: 2})
	require.NoError(t, err)
	require.Equal(t, "for "+s.MemberID, string(res.Assignment))
	require.NoError(t, c.Heartbeat(ctx, group, leader.MemberID, "", 2), "no rebalance")

	require.ErrorIs(t, c.Heartbeat(ctx, group, s.MemberID, "instance-1", 2), ErrInstanceFenced)
	_, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: s.MemberID, InstanceID: "instance-1", Generation: 2})
	require.ErrorIs(t, err, ErrInstanceFenced)
	_, err = c.Join(ctx, classicJoin(group, s.MemberID, "instance-1"))
	require.ErrorIs(t, err, ErrInstanceFenced)
	errs, err := c.Leave(ctx, group, []ClassicLeaver{{MemberID: s.MemberID, InstanceID: "instance-1"}})
	require.NoError(t, err)
	require.ErrorIs(t, errs[0], ErrInstanceFenced)
	require.NoError(t, c.Heartbeat(ctx, group, s2.MemberID, "instance-1", 2))
}

// TestClassicBadJoins: a classic member cannot join a group id that is a native group
// with live members, nor a group whose members share no protocol with it or use another
// protocol type; JoinGroup v4's MEMBER_ID_REQUIRED writes no member; bad arguments are
// refused. None of them changes the group.
func TestClassicBadJoins(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, _ := newClassic(t, pool)
	stream := newStream(t, pool, 2)

	native := testdb.Name("kg")
	join(t, pool, stream, native, "native-1")
	_, err := c.Join(ctx, classicJoin(native, "", ""))
	require.ErrorIs(t, err, ErrInconsistentGroupProtocol)

	group := testdb.Name("kg")
	a := joinAlone(t, c, group)
	syncLeader(t, c, group, a)
	_, err = c.Join(ctx, classicJoin(group, "", "", "roundrobin"))
	require.ErrorIs(t, err, ErrInconsistentGroupProtocol)
	other := classicJoin(group, "", "")
	other.ProtocolType = "connect"
	_, err = c.Join(ctx, other)
	require.ErrorIs(t, err, ErrInconsistentGroupProtocol)
	req := classicJoin(group, "", "")
	req.RequireKnownMemberID = true
	_, err = c.Join(ctx, req)
	var required *MemberIDRequiredError
	require.ErrorAs(t, err, &required)
	require.NotEmpty(t, required.MemberID)
	_, err = c.Join(ctx, classicJoin("bad group id", "", ""))
	require.ErrorIs(t, err, ErrInvalidGroupID)
	bad := classicJoin(group, "", "")
	bad.SessionTimeout = 0
	_, err = c.Join(ctx, bad)
	require.ErrorIs(t, err, ErrInvalidArgument)

	require.NoError(t, c.Heartbeat(ctx, group, a.MemberID, "", 1), "still stable: no rebalance")
	d, err := c.DescribeKafkaGroup(ctx, group)
	require.NoError(t, err)
	require.Len(t, d.Members, 1)
	require.Equal(t, "Stable", d.State)
}

// TestClassicAdmin: listing, describing, deleting offsets and groups, with the refusals
// for groups with live members.
func TestClassicAdmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, _ := newClassic(t, pool)
	stream := newStream(t, pool, 2)
	produceN(t, pool, stream, 0, 3)
	produceN(t, pool, stream, 1, 3)
	group := testdb.Name("kg")

	req := classicJoin(group, "", "")
	req.Topics = []string{stream}
	a, err := c.Join(ctx, req)
	require.NoError(t, err)
	syncLeader(t, c, group, a)
	_, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: a.MemberID, Generation: 1,
		Offsets: []StreamOffset{{Stream: stream, Partition: 0, Offset: 2}, {Stream: stream, Partition: 1, Offset: 3}}})
	require.NoError(t, err)

	groups, err := c.ListKafkaGroups(ctx)
	require.NoError(t, err)
	require.Contains(t, groups, KafkaGroup{Group: group, Type: GroupTypeClassic, State: "Stable", ProtocolType: "consumer",
		Protocol: "range", Generation: 1})
	d, err := c.DescribeKafkaGroup(ctx, group)
	require.NoError(t, err)
	require.Len(t, d.Members, 1)
	require.Equal(t, []byte("for "+a.MemberID), d.Members[0].Assignment)
	d, err = c.DescribeKafkaGroup(ctx, "no-such-group")
	require.NoError(t, err)
	require.Equal(t, "Dead", d.State)

	res, err := c.DeleteOffsets(ctx, group, []StreamPartition{{stream, 0}, {stream, 9}})
	require.NoError(t, err)
	require.ErrorIs(t, res[0].Err, ErrGroupSubscribed)
	require.ErrorIs(t, res[1].Err, streams.ErrPartitionNotFound)
	require.ErrorIs(t, c.DeleteKafkaGroup(ctx, group), ErrGroupNotEmpty)
	require.Equal(t, map[int32]int64{0: 2, 1: 3}, committed(t, c, group, stream))

	errs, err := c.Leave(ctx, group, []ClassicLeaver{{MemberID: a.MemberID}})
	require.NoError(t, err)
	require.NoError(t, errs[0])
	res, err = c.DeleteOffsets(ctx, group, []StreamPartition{{stream, 0}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	require.Equal(t, map[int32]int64{1: 3}, committed(t, c, group, stream))
	// An admin commit is accepted once the group is empty.
	res, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, Generation: -1,
		Offsets: []StreamOffset{{Stream: stream, Partition: 0, Offset: 1}}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	require.Equal(t, map[int32]int64{0: 1, 1: 3}, committed(t, c, group, stream))

	require.NoError(t, c.DeleteKafkaGroup(ctx, group))
	require.Empty(t, committed(t, c, group, stream))
	require.ErrorIs(t, c.DeleteKafkaGroup(ctx, group), ErrGroupNotFound)
	_, err = c.DeleteOffsets(ctx, group, []StreamPartition{{stream, 0}})
	require.ErrorIs(t, err, ErrGroupNotFound)

	// A group known only by offsets committed without a group is a consumer group.
	simple := testdb.Name("kg")
	_, err = c.CommitOffsets(ctx, &ClassicCommit{Group: simple, Generation: -1,
		Offsets: []StreamOffset{{Stream: stream, Partition: 0, Offset: 1}}})
	require.NoError(t, err)
	d, err = c.DescribeKafkaGroup(ctx, simple)
	require.NoError(t, err)
	require.Equal(t, GroupTypeConsumer, d.Type)
	require.Equal(t, "Empty", d.State)
	// A member id with an epoch and no classic group is taken for a KIP-848 member.
	res, err = c.CommitOffsets(ctx, &ClassicCommit{Group: simple, MemberID: "m", Generation: 3,
		Offsets: []StreamOffset{{Stream: stream, Partition: 0, Offset: 2}}})
	require.NoError(t, err)
	require.ErrorIs(t, res[0].Err, ErrUnknownMember)
	_, err = c.CommitOffsets(ctx, &ClassicCommit{Group: simple, Generation: 3,
		Offsets: []StreamOffset{{Stream: stream, Partition: 0, Offset: 2}}})
	require.ErrorIs(t, err, ErrIllegalGeneration)
	require.Equal(t, map[int32]int64{0: 1}, committed(t, c, simple, stream))
}

// TestClassicErrorCodesMap: every classic-group SQLSTATE maps to its sentinel.
func TestClassicErrorCodesMap(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]error{
		sqlerr.UnknownMember: ErrUnknownMember, sqlerr.InconsistentProtocol: ErrInconsistentGroupProtocol,
		sqlerr.FencedInstance: ErrInstanceFenced, sqlerr.IllegalGeneration: ErrIllegalGeneration,
		sqlerr.ClassicRebalanceUnderway: ErrRebalanceInProgress,
	} {
		err := sqlerr.Wrap(fmt.Errorf("x: %w", &pgconn.PgError{Code: code, Message: "m"}))
		require.True(t, errors.Is(err, want), code)
	}
}

// TestClassicGroupIsAGroupOfItsStreams: a classic group's offsets and assignment show in
// consumer_group_status (owner, lag, reason) like a native group's; consumer-aware
// retention keeps what its live members have not committed; and a native member
// cannot join the group id while classic members hold it.
func TestClassicGroupIsAGroupOfItsStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, _ := newClassic(t, pool)
	stream := newStream(t, pool, 1)
	produceN(t, pool, stream, 0, 10)
	group := testdb.Name("kg")

	req := classicJoin(group, "", "")
	req.Topics = []string{stream}
	a, err := c.Join(ctx, req)
	require.NoError(t, err)
	_, err = c.Sync(ctx, &ClassicSync{Group: group, MemberID: a.MemberID, Generation: a.Generation,
		Assignments: []ClassicAssignment{{MemberID: a.MemberID, Assignment: []byte("x"),
			Partitions: []StreamPartition{{stream, 0}, {stream, 5}, {"no-such-stream", 0}}}}})
	require.NoError(t, err)
	_, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: a.MemberID, Generation: a.Generation,
		Offsets: []StreamOffset{{Stream: stream, Partition: 0, Offset: 4}}})
	require.NoError(t, err)

	var (
		owner  *string
		epoch  *int64
		lag    int64
		reason *string
	)
	err = pool.QueryRow(ctx, `SELECT consumer_id, member_epoch, lag, reason FROM streamd.consumer_group_status
		WHERE stream_name = $1 AND group_id = $2 AND partition = 0`, stream, group).Scan(&owner, &epoch, &lag, &reason)
	require.NoError(t, err)
	require.Equal(t, a.MemberID, *owner)
	require.Equal(t, int64(a.Generation), *epoch)
	require.Equal(t, int64(6), lag)
	require.Nil(t, reason, "a live owner: progressing")

	var target int64
	var limitedBy *string
	err = pool.QueryRow(ctx, `SELECT target_offset, limited_by FROM streamd.retention_targets($1, NULL, 2, NULL, true, NULL)
		WHERE partition = 0`, stream).Scan(&target, &limitedBy)
	require.NoError(t, err)
	require.Equal(t, int64(4), target, "retention stops at the live classic group's offset")
	require.Equal(t, group, *limitedBy)

	_, err = memberJoin(ctx, pool, stream, group, "native-1", "", testSession, time.Minute, nil)
	require.ErrorIs(t, err, ErrInconsistentGroupProtocol)

	// Once the member is gone the partition is unowned and retention is free.
	_, err = c.Leave(ctx, group, []ClassicLeaver{{MemberID: a.MemberID}})
	require.NoError(t, err)
	err = pool.QueryRow(ctx, `SELECT reason FROM streamd.consumer_group_status
		WHERE stream_name = $1 AND group_id = $2 AND partition = 0`, stream, group).Scan(&reason)
	require.NoError(t, err)
	require.Equal(t, "unowned", *reason)
	err = pool.QueryRow(ctx, `SELECT target_offset FROM streamd.retention_targets($1, NULL, 2, NULL, true, NULL)
		WHERE partition = 0`, stream).Scan(&target)
	require.NoError(t, err)
	require.Equal(t, int64(8), target)
}

// TestClassicDeadMembersLeaveTheListing: with no timer, listing and describing expire
// dead members first, so a group whose members all died is Empty, as Kafka reports it.
// The database's clock: listing touches every group, so it never runs ahead of it.
func TestClassicDeadMembersLeaveTheListing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := NewClassic(pool, &ClassicConfig{PollInterval: 5 * time.Millisecond})
	require.NoError(t, err)
	group, other := testdb.Name("kg"), testdb.Name("kg")
	for _, g := range []string{group, other} {
		req := classicJoin(g, "", "")
		req.SessionTimeout = 1500 * time.Millisecond
		m, err := c.Join(ctx, req)
		require.NoError(t, err)
		syncLeader(t, c, g, m)
	}
	listed := func(g string) string {
		groups, err := c.ListKafkaGroups(ctx)
		require.NoError(t, err)
		for _, x := range groups {
			if x.Group == g {
				return x.State
			}
		}
		return ""
	}
	require.Eventually(t, func() bool { return listed(group) == "Empty" && listed(other) == "Empty" },
		10*time.Second, 20*time.Millisecond)
	d, err := c.DescribeKafkaGroup(ctx, group)
	require.NoError(t, err)
	require.Equal(t, "Empty", d.State)
	require.Equal(t, int32(2), d.Generation)
}
