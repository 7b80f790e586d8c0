package kafka

import (
	"context"
	"testing"
	"time"

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
