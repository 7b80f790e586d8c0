package kafka

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestDeleteRecordsOutOfRange: a DeleteRecords offset below -1 or past the high
// watermark is OFFSET_OUT_OF_RANGE for its partition, as from Kafka's
// ReplicaManager, and moves nothing; the request's good partition is served.
func TestDeleteRecordsOutOfRange(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("delrec")
	require.NoError(t, sc.CreateStream(ctx, topic, 3))
	cl := newClient(t, []string{ts.addr}, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for p := range int32(3) {
		for range 3 {
			require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte("v")}).FirstErr())
		}
	}

	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	for p, offset := range []int64{-5, 4, 2} {
		rp := kmsg.NewDeleteRecordsRequestTopicPartition()
		rp.Partition, rp.Offset = int32(p), offset
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	got := resp.Topics[0].Partitions
	require.Len(t, got, 3)
	require.Equal(t, kerr.OffsetOutOfRange.Code, got[0].ErrorCode, "offset -5: %v", kerr.ErrorForCode(got[0].ErrorCode))
	require.Equal(t, kerr.OffsetOutOfRange.Code, got[1].ErrorCode, "offset 4 past the high watermark 3: %v", kerr.ErrorForCode(got[1].ErrorCode))
	require.Zero(t, got[2].ErrorCode)
	require.Equal(t, int64(2), got[2].LowWatermark)

	info, err := sc.DescribeStream(ctx, topic)
	require.NoError(t, err)
	for p, want := range []int64{0, 0, 2} {
		require.Equal(t, want, info.PartitionInfo[p].LogStartOffset, "partition %d", p)
	}
}
