package kafka

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
)

// authzSetup starts a SASL server and makes a topic that rita may read and wally may
// write (nobody and otto: nothing).
func authzSetup(t *testing.T) (*testServer, string) {
	t.Helper()
	ts := startServer(t, testdb.Pool(t), &Config{Tokens: testTokens()})
	topic := testdb.Name("authz")
	createTopic(t, ts, topic, &streamconfig.AccessControl{Readers: []string{testReader}, Writers: []string{testWriter}})
	return ts, topic
}

// createTopic creates a two-partition topic with the access control given.
func createTopic(t *testing.T, ts *testServer, topic string, ac *streamconfig.AccessControl) {
	t.Helper()
	ctx := testCtx(t)
	require.NoError(t, streams.NewClient(ts.srv.pool, nil).CreateStream(ctx, topic, 2))
	require.NoError(t, streamconfig.NewStore(ts.srv.pool).Set(ctx, topic, &streamconfig.Config{AccessControl: ac}))
}

func countEvents(t *testing.T, ts *testServer, topic string) int {
	t.Helper()
	var n int
	require.NoError(t, ts.srv.pool.QueryRow(testCtx(t), "SELECT count(*) FROM streamd.events WHERE stream_name = $1", topic).Scan(&n))
	return n
}

// Produce needs write: a principal without it gets TOPIC_AUTHORIZATION_FAILED and
// nothing is written; the writer's records are. Fetch and ListOffsets need read.
func TestSASLProduceAndFetchNeedTheirPermission(t *testing.T) {
	t.Parallel()
	ts, topic := authzSetup(t)
	ctx := testCtx(t)

	for _, who := range [][2]string{{testReader, readerToken}, {testNobody, nobodyToken}} {
		cl := saslClient(t, ts.addr, "SCRAM-SHA-256", who[0], who[1], kgo.DefaultProduceTopic(topic),
			kgo.RecordPartitioner(kgo.ManualPartitioner()))
		err := cl.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte("refused")}).FirstErr()
		require.ErrorIs(t, err, kerr.TopicAuthorizationFailed, "%s may not write", who[0])
	}
	require.Zero(t, countEvents(t, ts, topic), "a refused produce wrote nothing")

	w := saslClient(t, ts.addr, "PLAIN", testWriter, writerToken, kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for i := range 3 {
		require.NoError(t, w.ProduceSync(ctx, &kgo.Record{Partition: int32(i % 2), Value: []byte{byte(i)}}).FirstErr())
	}
	require.Equal(t, 3, countEvents(t, ts, topic))

	// Fetch and ListOffsets at the protocol level, so the answer is the server's.
	fetch := func(cl *kgo.Client) *kmsg.FetchResponse {
		req := kmsg.NewPtrFetchRequest()
		req.MaxWaitMillis, req.MaxBytes = 0, 1<<20
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic = topic
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.PartitionMaxBytes = 0, 1<<20
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		return resp
	}
	listOffsets := func(cl *kgo.Client) int16 {
		req := kmsg.NewPtrListOffsetsRequest()
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = 0, -1
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		return resp.Topics[0].Partitions[0].ErrorCode
	}
	resp := fetch(w)
	require.Equal(t, kerr.TopicAuthorizationFailed.Code, resp.Topics[0].Partitions[0].ErrorCode, "the writer may not read")
	require.Empty(t, resp.Topics[0].Partitions[0].RecordBatches)
	require.Equal(t, kerr.TopicAuthorizationFailed.Code, listOffsets(w))

	r := saslClient(t, ts.addr, "SCRAM-SHA-512", testReader, readerToken)
	resp = fetch(r)
	require.Zero(t, resp.Topics[0].Partitions[0].ErrorCode)
	require.NotEmpty(t, resp.Topics[0].Partitions[0].RecordBatches)
	require.Zero(t, listOffsets(r))

	// The reader consumes every record with an ordinary consumer.
	cons := saslClient(t, ts.addr, "SCRAM-SHA-512", testReader, readerToken, kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	var got int
	for got < 3 {
		fs := cons.PollFetches(ctx)
		require.NoError(t, ctx.Err())
		require.NoError(t, fs.Err())
		got += len(fs.Records())
	}
	require.Equal(t, 3, got)
}

// Metadata lists the topics the principal may read or write; a topic it may not
// (existing or not) is TOPIC_AUTHORIZATION_FAILED. Admin sees everything.
func TestSASLMetadataListsDescribableTopics(t *testing.T) {
	t.Parallel()
	ts, topic := authzSetup(t)
	ctx := testCtx(t)
	metadata := func(cl *kgo.Client, topics ...string) *kmsg.MetadataResponse {
		req := kmsg.NewPtrMetadataRequest()
		if topics != nil {
			req.Topics = []kmsg.MetadataRequestTopic{}
			for _, name := range topics {
				rt := kmsg.NewMetadataRequestTopic()
				rt.Topic = kmsg.StringPtr(name)
				req.Topics = append(req.Topics, rt)
			}
		}
		resp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		return resp
	}
	names := func(resp *kmsg.MetadataResponse) map[string]int16 {
		out := map[string]int16{}
		for _, t := range resp.Topics {
			out[*t.Topic] = t.ErrorCode
		}
		return out
	}
	missing := testdb.Name("authz-missing")
	// Other tests share the database and grant topics to these principals (or to
	// "*"): the check is that a topic granted to someone else is not listed.
	hidden := testdb.Name("authz-hidden")
	createTopic(t, ts, hidden, &streamconfig.AccessControl{Readers: []string{"someone-else"}, Writers: []string{"someone-else"}})
	for _, who := range [][2]string{{testReader, readerToken}, {testWriter, writerToken}} {
		cl := saslClient(t, ts.addr, "PLAIN", who[0], who[1])
		all := names(metadata(cl))
		require.Contains(t, all, topic, "%s may describe the topic", who[0])
		require.NotContains(t, all, hidden, "%s sees only the topics it may use", who[0])
		some := names(metadata(cl, topic, missing))
		require.Zero(t, some[topic])
		require.Equal(t, kerr.TopicAuthorizationFailed.Code, some[missing], "an unknown topic is refused, not unknown")
	}
	nobody := saslClient(t, ts.addr, "PLAIN", testNobody, nobodyToken)
	listed := names(metadata(nobody))
	require.NotContains(t, listed, topic)
	require.NotContains(t, listed, hidden)
	require.Equal(t, map[string]int16{topic: kerr.TopicAuthorizationFailed.Code}, names(metadata(nobody, topic)))

	admin := saslClient(t, ts.addr, "PLAIN", access.AdminPrincipal, adminToken)
	all := names(metadata(admin))
	require.Contains(t, all, topic)
	require.Contains(t, all, hidden)
	require.Equal(t, kerr.UnknownTopicOrPartition.Code, names(metadata(admin, missing))[missing])
}

// The group rule: a principal may use a group when it may read every topic of the
// group and of the request; deleting a group or its offsets needs admin.
func TestSASLGroupsNeedReadOnTheirTopics(t *testing.T) {
	t.Parallel()
	ts, topic := authzSetup(t)
	ctx := testCtx(t)
	group := testdb.Name("authz-group")
	reader := saslClient(t, ts.addr, "PLAIN", testReader, readerToken)
	writer := saslClient(t, ts.addr, "PLAIN", testWriter, writerToken)
	nobody := saslClient(t, ts.addr, "PLAIN", testNobody, nobodyToken)
	w := saslClient(t, ts.addr, "PLAIN", testWriter, writerToken, kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for range 3 {
		require.NoError(t, w.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte("for the group")}).FirstErr())
	}

	commit := func(cl *kgo.Client, offset int64) int16 {
		req := kmsg.NewPtrOffsetCommitRequest()
		req.Group, req.Generation = group, -1
		rt := kmsg.NewOffsetCommitRequestTopic()
		rt.Topic = topic
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset = 0, offset
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		return resp.Topics[0].Partitions[0].ErrorCode
	}
	fetchOffsets := func(cl *kgo.Client) (int16, int64) {
		req := kmsg.NewPtrOffsetFetchRequest()
		req.Group = group
		resp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		if resp.ErrorCode != 0 || len(resp.Topics) == 0 {
			return resp.ErrorCode, -1
		}
		return 0, resp.Topics[0].Partitions[0].Offset
	}

	require.Equal(t, kerr.GroupAuthorizationFailed.Code, commit(writer, 7), "the writer may not read the topic")
	require.Equal(t, kerr.GroupAuthorizationFailed.Code, commit(nobody, 7))
	require.Zero(t, commit(reader, 2))
	code, off := fetchOffsets(reader)
	require.Zero(t, code)
	require.Equal(t, int64(2), off, "the refused commits wrote nothing")
	code, _ = fetchOffsets(nobody)
	require.Equal(t, kerr.GroupAuthorizationFailed.Code, code, "the group's topic decides, though the request names none")

	join := func(cl *kgo.Client) int16 {
		req := kmsg.NewPtrJoinGroupRequest()
		req.Group, req.ProtocolType = group, "consumer"
		req.SessionTimeoutMillis, req.RebalanceTimeoutMillis = 10000, 10000
		meta := kmsg.NewConsumerMemberMetadata()
		meta.Topics = []string{topic}
		p := kmsg.NewJoinGroupRequestProtocol()
		p.Name, p.Metadata = "range", meta.AppendTo(nil)
		req.Protocols = append(req.Protocols, p)
		resp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		return resp.ErrorCode
	}
	require.Equal(t, kerr.GroupAuthorizationFailed.Code, join(nobody))
	require.Equal(t, kerr.GroupAuthorizationFailed.Code, join(writer))

	describe := kmsg.NewPtrDescribeGroupsRequest()
	describe.Groups = []string{group}
	dresp, err := describe.RequestWith(ctx, nobody)
	require.NoError(t, err)
	require.Equal(t, kerr.GroupAuthorizationFailed.Code, dresp.Groups[0].ErrorCode)

	list, err := kmsg.NewPtrListGroupsRequest().RequestWith(ctx, nobody)
	require.NoError(t, err)
	for _, g := range list.Groups {
		require.NotEqual(t, group, g.Group, "ListGroups hides a group the principal may not read")
	}

	del := kmsg.NewPtrDeleteGroupsRequest()
	del.Groups = []string{group}
	delResp, err := del.RequestWith(ctx, reader)
	require.NoError(t, err)
	require.Equal(t, kerr.GroupAuthorizationFailed.Code, delResp.Groups[0].ErrorCode, "deleting a group needs admin")
	code, off = fetchOffsets(reader)
	require.Zero(t, code)
	require.Equal(t, int64(2), off, "the group is still there")

	// A group consumer reading as rita, end to end (the client's default protocol).
	cons := saslClient(t, ts.addr, "SCRAM-SHA-256", testReader, readerToken, kgo.ConsumerGroup(testdb.Name("authz-cg")),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	pollCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		fs := cons.PollFetches(pollCtx)
		require.NoError(t, pollCtx.Err(), "the reader's group consumer got nothing")
		require.NoError(t, fs.Err())
		if len(fs.Records()) > 0 {
			break
		}
	}
}

// Administration: creating topics is admin's; deleting a topic, its records or
// altering its configs needs admin on the stream; broker resources are
// CLUSTER_AUTHORIZATION_FAILED. Refusals change nothing.
func TestSASLAdminAPIsNeedAdmin(t *testing.T) {
	t.Parallel()
	ts, topic := authzSetup(t)
	ctx := testCtx(t)
	reader := saslClient(t, ts.addr, "PLAIN", testReader, readerToken)

	create := kmsg.NewPtrCreateTopicsRequest()
	ct := kmsg.NewCreateTopicsRequestTopic()
	newTopic := testdb.Name("authz-new")
	ct.Topic, ct.NumPartitions, ct.ReplicationFactor = newTopic, 1, 1
	create.Topics = append(create.Topics, ct)
	cresp, err := create.RequestWith(ctx, reader)
	require.NoError(t, err)
	require.Equal(t, kerr.TopicAuthorizationFailed.Code, cresp.Topics[0].ErrorCode)
	_, err = streams.NewClient(ts.srv.pool, nil).DescribeStream(ctx, newTopic)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)

	del := kmsg.NewPtrDeleteTopicsRequest()
	del.TopicNames = []string{topic}
	dt := kmsg.NewDeleteTopicsRequestTopic()
	dt.Topic = kmsg.StringPtr(topic)
	del.Topics = append(del.Topics, dt)
	dresp, err := del.RequestWith(ctx, reader)
	require.NoError(t, err)
	require.Equal(t, kerr.TopicAuthorizationFailed.Code, dresp.Topics[0].ErrorCode)

	dr := kmsg.NewPtrDeleteRecordsRequest()
	drt := kmsg.NewDeleteRecordsRequestTopic()
	drt.Topic = topic
	drp := kmsg.NewDeleteRecordsRequestTopicPartition()
	drp.Partition, drp.Offset = 0, -1
	drt.Partitions = append(drt.Partitions, drp)
	dr.Topics = append(dr.Topics, drt)
	drresp, err := dr.RequestWith(ctx, reader)
	require.NoError(t, err)
	require.Equal(t, kerr.TopicAuthorizationFailed.Code, drresp.Topics[0].Partitions[0].ErrorCode)

	alter := kmsg.NewPtrIncrementalAlterConfigsRequest()
	for _, typ := range []kmsg.ConfigResourceType{kmsg.ConfigResourceTypeTopic, kmsg.ConfigResourceTypeBroker} {
		res := kmsg.NewIncrementalAlterConfigsRequestResource()
		res.ResourceType, res.ResourceName = typ, topic
		if typ == kmsg.ConfigResourceTypeBroker {
			res.ResourceName = strconv.Itoa(int(ts.srv.self().NodeID)) // the client sends it to that broker
		}
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Value = "retention.ms", kmsg.StringPtr("60000")
		res.Configs = append(res.Configs, c)
		alter.Resources = append(alter.Resources, res)
	}
	aresp, err := alter.RequestWith(ctx, reader)
	require.NoError(t, err)
	require.Len(t, aresp.Resources, 2)
	for _, r := range aresp.Resources {
		want := kerr.TopicAuthorizationFailed.Code
		if r.ResourceType == kmsg.ConfigResourceTypeBroker {
			want = kerr.ClusterAuthorizationFailed.Code
		}
		require.Equal(t, want, r.ErrorCode, "resource %v", r.ResourceType)
	}
	cfg, err := streamconfig.NewStore(ts.srv.pool).Get(ctx, topic)
	require.NoError(t, err)
	require.Nil(t, cfg.Retention, "the refused alter changed nothing")

	// The same requests as admin go through.
	admin := saslClient(t, ts.addr, "SCRAM-SHA-256", access.AdminPrincipal, adminToken)
	cresp, err = create.RequestWith(ctx, admin)
	require.NoError(t, err)
	require.Zero(t, cresp.Topics[0].ErrorCode)
	dresp, err = del.RequestWith(ctx, admin)
	require.NoError(t, err)
	require.Zero(t, dresp.Topics[0].ErrorCode)
}
