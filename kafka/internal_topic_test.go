package kafka

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// Metadata lists __consumer_offsets as an internal topic (all topics and by name),
// so a regex consumer skips it; producing to it is INVALID_TOPIC_EXCEPTION and writes
// nothing; fetching it finds it empty; CreateTopics finds it there.
func TestConsumerOffsetsIsAnInternalTopic(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	cl := newClient(t, []string{ts.addr})
	pfx := testdb.Name("regex")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, pfx+"-a", 1))

	all, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl) // every topic
	require.NoError(t, err)
	internal := map[string]bool{}
	for _, mt := range all.Topics {
		require.Zero(t, mt.ErrorCode)
		internal[*mt.Topic] = mt.IsInternal
	}
	require.Contains(t, internal, consumerOffsetsTopic)
	require.True(t, internal[consumerOffsetsTopic])
	require.Contains(t, internal, pfx+"-a")
	require.False(t, internal[pfx+"-a"])
	named := kmsg.NewPtrMetadataRequest()
	named.Topics = []kmsg.MetadataRequestTopic{{Topic: kmsg.StringPtr(consumerOffsetsTopic)}}
	resp, err := named.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Len(t, resp.Topics, 1)
	require.Zero(t, resp.Topics[0].ErrorCode)
	require.True(t, resp.Topics[0].IsInternal)
	require.Len(t, resp.Topics[0].Partitions, 1)

	// A regex subscription skips it (franz-go skips internal topics).
	consumer := newClient(t, []string{ts.addr}, kgo.ConsumeTopics(pfx+".*", "__consumer_.*"), kgo.ConsumeRegex(),
		kgo.MetadataMinAge(100*time.Millisecond))
	require.Eventually(t, func() bool {
		consumer.ForceMetadataRefresh()
		got := consumer.GetConsumeTopics()
		return len(got) == 1 && got[0] == pfx+"-a"
	}, 15*time.Second, 50*time.Millisecond)
	require.NotContains(t, consumer.GetConsumeTopics(), consumerOffsetsTopic)

	// Produce is refused, as Kafka refuses it; nothing is written anywhere.
	err = cl.ProduceSync(ctx, &kgo.Record{Topic: consumerOffsetsTopic, Value: []byte("x")}).FirstErr()
	require.ErrorIs(t, err, kerr.InvalidTopicException)
	_, err = sc.DescribeStream(ctx, consumerOffsetsTopic)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)

	// Fetch and ListOffsets find it empty.
	codecs, recs := rawFetch(t, ctx, cl, consumerOffsetsTopic)
	require.Empty(t, codecs)
	require.Empty(t, recs)
	lo := kmsg.NewPtrListOffsetsRequest()
	lo.ReplicaID = -1
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = consumerOffsetsTopic
	lp := kmsg.NewListOffsetsRequestTopicPartition()
	lp.Timestamp = -1
	lt.Partitions = append(lt.Partitions, lp)
	lo.Topics = append(lo.Topics, lt)
	loResp, err := lo.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Zero(t, loResp.Topics[0].Partitions[0].ErrorCode)
	require.Zero(t, loResp.Topics[0].Partitions[0].Offset)

	created, err := newAdmin(t, ts.addr).CreateTopic(ctx, 1, 1, nil, consumerOffsetsTopic)
	require.ErrorIs(t, err, kerr.TopicAlreadyExists, "%+v", created)
}
