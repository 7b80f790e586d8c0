package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// consumerJoin sends a KIP-848 join (epoch 0) for a topic with kmsg and returns the
// answer.
func consumerJoin(ctx context.Context, t *testing.T, cl *kgo.Client, group, memberID, topic string) *kmsg.ConsumerGroupHeartbeatResponse {
	t.Helper()
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Group, req.MemberID, req.RebalanceTimeoutMillis = group, memberID, 10000
	req.SubscribedTopicNames = []string{topic}
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	return resp
}

// TestKIP848MemberTakesOverAnEmptyClassicGroup: a group id whose classic members all
// left (an Empty classic group) becomes a consumer group at the first KIP-848
// heartbeat, as in Kafka: the franz-go KIP-848 consumer that joins it goes on from the
// classic group's committed offsets and its commits land (they were refused as
// UNKNOWN_MEMBER_ID, the Empty classic row taking the commit for a classic one). A
// classic group with a live member still answers GROUP_ID_NOT_FOUND to a KIP-848 join.
func TestKIP848MemberTakesOverAnEmptyClassicGroup(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{ConsumerGroupSessionTimeout: 3 * time.Second,
		ConsumerGroupHeartbeatInterval: 200 * time.Millisecond})
	ctx := testCtx(t)
	topic, group := testdb.Name("kg"), testdb.Name("kg")
	const partitions = 2
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, partitions))
	produceTopic(t, pool, topic, partitions, 5)

	classic := newClient(t, []string{ts.addr}, append(groupClientOpts(group, topic, kgo.RangeBalancer()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))...)
	pollTopics(ctx, t, classic, map[string]int32{topic: partitions})
	// A live classic member: a KIP-848 join is refused and writes nothing.
	raw := newClient(t, []string{ts.addr})
	resp := consumerJoin(ctx, t, raw, group, "k848-early", topic)
	require.Equal(t, kerr.GroupIDNotFound.Code, resp.ErrorCode, "a classic group with a live member")
	require.NoError(t, classic.CommitUncommittedOffsets(ctx))
	classic.Close() // leaves the group: Empty
	kg, err := ts.srv.groups.DescribeKafkaGroup(ctx, group)
	require.NoError(t, err)
	require.Equal(t, consumergroup.GroupTypeClassic, kg.Type)
	require.Equal(t, "Empty", kg.State)

	produceTopic(t, pool, topic, partitions, 3)
	k848 := newClient(t, []string{ts.addr}, kip848Opts(group, topic)...)
	var got []*kgo.Record
	for len(got) < partitions*3 {
		fs := k848.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "records after the classic group's commits; got %d", len(got))
		got = append(got, fs.Records()...)
	}
	for _, r := range got {
		require.GreaterOrEqual(t, r.Offset, int64(5), "from the classic group's committed offsets")
	}
	require.NoError(t, k848.CommitRecords(ctx, got...), "the KIP-848 member's commits land")
	offs, err := ts.srv.groups.FetchOffsets(ctx, group, []string{topic})
	require.NoError(t, err)
	require.Len(t, offs, partitions)
	for _, o := range offs {
		require.Equal(t, int64(8), o.Offset, "partition %d", o.Partition)
	}
	kg, err = ts.srv.groups.DescribeKafkaGroup(ctx, group)
	require.NoError(t, err)
	require.Equal(t, consumergroup.GroupTypeConsumer, kg.Type, "the group id is a consumer group now")
}

// consumerCall sends one ConsumerGroupHeartbeat with kmsg.
func consumerCall(ctx context.Context, cl *kgo.Client, group, memberID, instanceID string, epoch int32, topics ...string) (*kmsg.ConsumerGroupHeartbeatResponse, error) {
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Group, req.MemberID, req.MemberEpoch, req.RebalanceTimeoutMillis = group, memberID, epoch, 10000
	if instanceID != "" {
		req.InstanceID = &instanceID
	}
	if topics != nil {
		req.SubscribedTopicNames = topics
	}
	return req.RequestWith(ctx, cl)
}

// TestReplacedStaticKIP848MemberDoesNotRejoin: a static KIP-848 member x (two
// topics) heartbeats while a restart of its instance, y, joins with the same instance
// id and one of the topics. x's heartbeat was validated before y's join deleted x's
// row; held at its first topic (the test locks x's membership row there), it used to
// go on to its second topic, find its membership taken over by y through the instance
// id, join it again and take it back. The calls of one instance id are serialized now:
// y's join waits for x's heartbeat, takes the topic over after it, and x's next
// heartbeat is UNKNOWN_MEMBER_ID and leaves what it still held; y keeps the topic.
func TestReplacedStaticKIP848MemberDoesNotRejoin(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{ConsumerGroupSessionTimeout: 30 * time.Second,
		ConsumerGroupHeartbeatInterval: 200 * time.Millisecond})
	ctx := testCtx(t)
	prefix, group := testdb.Name("k848"), testdb.Name("kg")
	first, second := prefix+"-a", prefix+"-b" // x's reconciliation goes through them in this order
	client := streams.NewClient(pool, nil)
	require.NoError(t, client.CreateStream(ctx, first, 1))
	require.NoError(t, client.CreateStream(ctx, second, 1))
	xcl, ycl := newClient(t, []string{ts.addr}), newClient(t, []string{ts.addr})

	x, err := consumerCall(ctx, xcl, group, "x", "inst", 0, first, second)
	require.NoError(t, err)
	require.Zero(t, x.ErrorCode)
	registrations := func(stream string) []string {
		rows, err := pool.Query(ctx, `SELECT consumer_id FROM streamd.consumer_registrations
			WHERE stream_name = $1 AND group_id = $2 ORDER BY 1`, stream, group)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return ids
	}
	require.Equal(t, []string{"x"}, registrations(second))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM streamd.consumer_registrations
		WHERE stream_name = $1 AND group_id = $2 AND consumer_id = 'x' FOR UPDATE`, first, group)
	require.NoError(t, err)
	type answer struct {
		resp *kmsg.ConsumerGroupHeartbeatResponse
		err  error
	}
	xdone, ydone := make(chan answer, 1), make(chan answer, 1)
	go func() {
		resp, err := consumerCall(ctx, xcl, group, "x", "", x.MemberEpoch)
		xdone <- answer{resp, err}
	}()
	testdb.WaitForLockWait(t, pool, tx, "group_heartbeat")
	var xpid uint32
	require.NoError(t, pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))`,
		tx.Conn().PgConn().PID()).Scan(&xpid))
	go func() {
		resp, err := consumerCall(ctx, ycl, group, "y", "inst", 0, second)
		ydone <- answer{resp, err}
	}()
	// y's join either waits for x's call (serialized) or ends without waiting.
	var early *answer
	testdb.WaitFor(t, 20*time.Second, "y's join done or waiting for x", func() bool {
		select {
		case a := <-ydone:
			early = &a
			return true
		default:
		}
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))`,
			xpid).Scan(&n))
		return n > 0
	})
	require.NoError(t, tx.Rollback(ctx))
	xa := <-xdone
	require.NoError(t, xa.err)
	ya := early
	if ya == nil {
		a := <-ydone
		ya = &a
	}
	require.NoError(t, ya.err)
	require.Zero(t, ya.resp.ErrorCode, "y joins")

	require.Equal(t, []string{"y"}, registrations(second), "the replaced member did not take the topic back")
	again, err := consumerCall(ctx, xcl, group, "x", "", x.MemberEpoch)
	require.NoError(t, err)
	require.Contains(t, []int16{kerr.UnknownMemberID.Code, kerr.FencedMemberEpoch.Code}, again.ErrorCode, "x was replaced")
	require.Empty(t, registrations(first), "x left what it still held")
	require.Equal(t, []string{"y"}, registrations(second))
	y2, err := consumerCall(ctx, ycl, group, "y", "", ya.resp.MemberEpoch)
	require.NoError(t, err)
	require.Zero(t, y2.ErrorCode)
	require.NotNil(t, y2.Assignment)
	require.Len(t, y2.Assignment.Topics, 1, "y owns its topic")
}

// TestKIP848GroupIsListedFromItsFirstHeartbeat: a KIP-848 group whose subscription
// resolves to no stream yet (a regex that matches nothing: Java's consumer sends it at
// once; franz-go joins only once its own metadata matched a topic) is a consumer group
// from its member's first heartbeat: ListGroups lists it (type "consumer", Stable),
// DescribeGroups and ConsumerGroupDescribe show it with its member, and DeleteGroups
// finds it once the member left. It was unknown (not listed, Dead, GROUP_ID_NOT_FOUND)
// until it consumed a stream.
func TestKIP848GroupIsListedFromItsFirstHeartbeat(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{ConsumerGroupSessionTimeout: 30 * time.Second,
		ConsumerGroupHeartbeatInterval: 200 * time.Millisecond})
	ctx := testCtx(t)
	group, prefix := testdb.Name("kg"), testdb.Name("none")
	cl := newClient(t, []string{ts.addr})
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Group, req.MemberID, req.RebalanceTimeoutMillis = group, "m1", 10000
	regex := "^" + prefix + "-.*$"
	req.SubscribedTopicRegex = &regex
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Zero(t, resp.ErrorCode)
	require.NotNil(t, resp.Assignment)
	require.Empty(t, resp.Assignment.Topics, "nothing to consume yet")

	adm := newAdmin(t, ts.addr)
	listed, err := adm.ListGroups(ctx)
	require.NoError(t, err)
	require.Contains(t, listed, group)
	require.Equal(t, consumergroup.GroupTypeConsumer, listed[group].GroupType)
	require.Equal(t, "Stable", listed[group].State)
	require.Equal(t, "consumer", listed[group].ProtocolType)

	described, err := adm.DescribeGroups(ctx, group)
	require.NoError(t, err)
	d := described[group]
	require.NoError(t, d.Err)
	require.Equal(t, "Stable", d.State)
	require.Equal(t, "consumer", d.ProtocolType)
	require.Len(t, d.Members, 1)
	require.Equal(t, "m1", d.Members[0].MemberID)

	cd, err := adm.DescribeConsumerGroups(ctx, group)
	require.NoError(t, err)
	require.NoError(t, cd[group].Err)
	require.Len(t, cd[group].Members, 1)
	require.Equal(t, "m1", cd[group].Members[0].MemberID)

	_, err = consumerCall(ctx, cl, group, "m1", "", -1)
	require.NoError(t, err)
	listed, err = adm.ListGroups(ctx)
	require.NoError(t, err)
	require.Equal(t, "Empty", listed[group].State, "its member left")
	deleted, err := adm.DeleteGroups(ctx, group)
	require.NoError(t, err)
	require.NoError(t, deleted[group].Err)
	listed, err = adm.ListGroups(ctx)
	require.NoError(t, err)
	require.NotContains(t, listed, group)
}
