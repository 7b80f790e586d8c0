package kafka

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestMetadataByTopicID: Metadata v12 naming a topic by its id (KIP-516), as Kafka
// answers it, describes the topic Metadata gave that id; an id no topic has is
// UNKNOWN_TOPIC_ID.
func TestMetadataByTopicID(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	topic := testdb.Name("mdbyid")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, 3))
	cl := newClient(t, []string{ts.addr})

	req := kmsg.NewPtrMetadataRequest()
	req.Version = 12
	for _, id := range [][16]byte{topicID(topic), topicID(testdb.Name("nosuch"))} {
		rt := kmsg.NewMetadataRequestTopic()
		rt.TopicID = id
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Len(t, resp.Topics, 2)
	got := resp.Topics[0]
	require.Zero(t, got.ErrorCode, "%v", kerr.ErrorForCode(got.ErrorCode))
	require.NotNil(t, got.Topic)
	require.Equal(t, topic, *got.Topic)
	require.Equal(t, topicID(topic), got.TopicID)
	require.Len(t, got.Partitions, 3)
	require.Equal(t, kerr.UnknownTopicID.Code, resp.Topics[1].ErrorCode)
}

// TestDeleteTopicsByID: DeleteTopics v6 naming a topic by its id (KIP-516; the Java
// admin's deleteTopics(TopicCollection.ofTopicIds(...))) deletes the topic Metadata
// gave that id; an id no topic has is UNKNOWN_TOPIC_ID.
func TestDeleteTopicsByID(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("delbyid")
	require.NoError(t, sc.CreateStream(ctx, topic, 1))
	cl := newClient(t, []string{ts.addr})

	req := kmsg.NewPtrDeleteTopicsRequest()
	req.Version, req.TimeoutMillis = 6, 10000
	for _, id := range [][16]byte{topicID(topic), topicID(testdb.Name("nosuch"))} {
		rt := kmsg.NewDeleteTopicsRequestTopic()
		rt.TopicID = id
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Len(t, resp.Topics, 2)
	require.Zero(t, resp.Topics[0].ErrorCode, "%v", kerr.ErrorForCode(resp.Topics[0].ErrorCode))
	require.Equal(t, topicID(topic), resp.Topics[0].TopicID)
	require.Equal(t, kerr.UnknownTopicID.Code, resp.Topics[1].ErrorCode)
	_, err = sc.DescribeStream(ctx, topic)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)

	// The id of the topic just deleted (still in the instance's cache) is unknown now.
	resp, err = req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Equal(t, kerr.UnknownTopicID.Code, resp.Topics[0].ErrorCode, "%v", kerr.ErrorForCode(resp.Topics[0].ErrorCode))
}
