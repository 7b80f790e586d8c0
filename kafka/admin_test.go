package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
)

func topicConfig(t *testing.T, ctx context.Context, adm *kadm.Client, topic string) map[string]string {
	t.Helper()
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	require.NoError(t, err)
	rc, err := rcs.On(topic, nil)
	require.NoError(t, err)
	require.NoError(t, rc.Err)
	out := map[string]string{}
	for _, c := range rc.Configs {
		out[c.Key] = c.MaybeValue()
	}
	return out
}

// The admin calls through kadm: create (with configs), describe and alter configs
// (mapped onto the stream's configuration), grow partitions, delete records, delete.
func TestAdminThroughKadm(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	adm := newAdmin(t, ts.addr)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("admin")

	ms := "3600000"
	created, err := adm.CreateTopic(ctx, 2, 3, map[string]*string{"retention.ms": &ms, "cleanup.policy": kadm.StringPtr("compact")}, topic)
	require.NoError(t, err)
	require.NoError(t, created.Err)
	require.Equal(t, int32(2), created.NumPartitions)
	info, err := sc.DescribeStream(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, int32(2), info.Partitions)
	cfg, err := streamconfig.NewStore(pool).Get(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, streamconfig.CleanupCompact, cfg.Retention.CleanupPolicy)
	require.Equal(t, time.Hour, time.Duration(*cfg.Retention.MaxAge))

	again, err := adm.CreateTopic(ctx, 2, 1, nil, topic)
	require.ErrorIs(t, err, kerr.TopicAlreadyExists)
	require.Equal(t, topic, again.Topic)
	bad, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"retention.ms": kadm.StringPtr("1500")}, testdb.Name("badcfg"))
	require.ErrorIs(t, err, kerr.InvalidConfig, "retention.ms in whole seconds only")
	_, err = sc.DescribeStream(ctx, bad.Topic)
	require.ErrorIs(t, err, streams.ErrStreamNotFound, "a refused create creates nothing")

	got := topicConfig(t, ctx, adm, topic)
	require.Equal(t, "3600000", got["retention.ms"])
	require.Equal(t, "compact", got["cleanup.policy"])
	require.Equal(t, "-1", got["retention.bytes"])
	require.Equal(t, "1048576", got["max.message.bytes"])
	require.Equal(t, "LogAppendTime", got["message.timestamp.type"])

	alt, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{
		{Op: kadm.SetConfig, Name: "retention.bytes", Value: kadm.StringPtr("1000000")},
		{Op: kadm.DeleteConfig, Name: "retention.ms"},
		{Op: kadm.AppendConfig, Name: "cleanup.policy", Value: kadm.StringPtr("delete")},
		{Op: kadm.SetConfig, Name: "max.message.bytes", Value: kadm.StringPtr("100")},
	}, topic)
	require.NoError(t, err)
	require.NoError(t, alt[0].Err)
	got = topicConfig(t, ctx, adm, topic)
	require.Equal(t, "1000000", got["retention.bytes"])
	require.Equal(t, "-1", got["retention.ms"])
	require.Equal(t, "compact,delete", got["cleanup.policy"])
	require.Equal(t, "100", got["max.message.bytes"])

	// A bad change among good ones changes nothing.
	alt, err = adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{
		{Op: kadm.SetConfig, Name: "retention.bytes", Value: kadm.StringPtr("5")},
		{Op: kadm.SetConfig, Name: "segment.bytes", Value: kadm.StringPtr("5")},
	}, topic)
	require.NoError(t, err)
	require.ErrorIs(t, alt[0].Err, kerr.InvalidConfig)
	require.Equal(t, "1000000", topicConfig(t, ctx, adm, topic)["retention.bytes"])

	// max.message.bytes is the stream's payload limit: a larger record is refused.
	// (The topic compacts: its records have keys, as Kafka requires.)
	prod := newClient(t, []string{ts.addr}, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	err = prod.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: make([]byte, 101)}).FirstErr()
	require.ErrorIs(t, err, kerr.MessageTooLarge)

	// Partitions grow, never shrink.
	cp, err := adm.CreatePartitions(ctx, 2, topic) // +2: 4 in all
	require.NoError(t, err)
	require.NoError(t, cp[topic].Err)
	info, err = sc.DescribeStream(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, int32(4), info.Partitions)
	cp, err = adm.UpdatePartitions(ctx, 3, topic)
	require.NoError(t, err)
	require.ErrorIs(t, cp[topic].Err, kerr.InvalidPartitions)
	cp, err = adm.UpdatePartitions(ctx, 10001, topic) // over streamd's limit, as CreateTopics answers it
	require.NoError(t, err)
	require.ErrorIs(t, cp[topic].Err, kerr.InvalidPartitions)

	// DeleteRecords moves the log start.
	recs := make([]*kgo.Record, 5)
	for i := range recs {
		recs[i] = &kgo.Record{Partition: 1, Key: []byte("k"), Value: []byte("v")}
	}
	require.NoError(t, prod.ProduceSync(ctx, recs...).FirstErr())
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: topic, Partition: 1, At: 3})
	dr, err := adm.DeleteRecords(ctx, offs)
	require.NoError(t, err)
	require.NoError(t, dr.Error())
	starts, err := adm.ListStartOffsets(ctx, topic)
	require.NoError(t, err)
	start, _ := starts.Lookup(topic, 1)
	require.Equal(t, int64(3), start.Offset)
	ends, err := adm.ListEndOffsets(ctx, topic)
	require.NoError(t, err)
	end, _ := ends.Lookup(topic, 1)
	require.Equal(t, int64(5), end.Offset)

	// DescribeCluster and delete.
	cl, err := adm.BrokerMetadata(ctx)
	require.NoError(t, err)
	require.Len(t, cl.Brokers, 1)
	del, err := adm.DeleteTopics(ctx, topic, "no-such-topic-x")
	require.NoError(t, err)
	require.NoError(t, del[topic].Err)
	require.ErrorIs(t, del["no-such-topic-x"].Err, kerr.UnknownTopicOrPartition)
	_, err = sc.DescribeStream(ctx, topic)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
}

// A topic is not auto-created unless the server says so.
func TestAutoCreateIsASetting(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := testCtx(t)
	off := startServer(t, pool, nil)
	topic := testdb.Name("auto")
	prod := newClient(t, []string{off.addr}, kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation(),
		kgo.RecordRetries(2), kgo.UnknownTopicRetries(1))
	err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr()
	require.ErrorIs(t, err, kerr.UnknownTopicOrPartition)

	on := startServer(t, pool, &Config{AutoCreateTopics: true, DefaultPartitions: 3})
	prod = newClient(t, []string{on.addr}, kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation())
	require.NoError(t, prod.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr())
	info, err := streams.NewClient(pool, nil).DescribeStream(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, int32(3), info.Partitions)
}
