package kafka

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestOffsetCommitMetadataTooLarge: an offset whose metadata is over 4096
// characters (Kafka's offset.metadata.max.bytes, counted as Java counts a String)
// is OFFSET_METADATA_TOO_LARGE for its partition and not written; the request's
// other partitions are committed, metadata of 4096 characters (of two bytes each)
// included.
func TestOffsetCommitMetadataTooLarge(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	cl := newClient(t, []string{ts.addr})
	topic, group := testdb.Name("meta"), testdb.Name("meta")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, 2))
	produceTopic(t, pool, topic, 2, 3)

	metas := []string{strings.Repeat("a", 4097), strings.Repeat("ü", 4096)}
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation = group, -1
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = topic
	for p, m := range metas {
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset, rp.Metadata = int32(p), 2, &m
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	got := resp.Topics[0].Partitions
	require.Equal(t, kerr.OffsetMetadataTooLarge.Code, got[0].ErrorCode, "%v", kerr.ErrorForCode(got[0].ErrorCode))
	require.Zero(t, got[1].ErrorCode, "%v", kerr.ErrorForCode(got[1].ErrorCode))

	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	require.NoError(t, err)
	_, ok := offs.Lookup(topic, 0)
	require.False(t, ok, "the refused offset was not written")
	o, ok := offs.Lookup(topic, 1)
	require.True(t, ok)
	require.Equal(t, int64(2), o.At)
	require.Equal(t, metas[1], o.Metadata)
}
