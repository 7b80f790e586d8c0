package kafka

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestListOffsetsEarliestLocal: ListOffsets v8's -4 (EARLIEST_LOCAL_TIMESTAMP,
// KIP-405; the Java admin's OffsetSpec.earliestLocal(), kafka-get-offsets --time
// earliest-local) is the log start, as from a Kafka broker without tiered storage:
// streamd has no remote tier.
func TestListOffsetsEarliestLocal(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("earliestlocal")
	require.NoError(t, sc.CreateStream(ctx, topic, 1))
	_, err := sc.AppendPartition(ctx, topic, 0, make([]streams.Record, 5), nil)
	require.NoError(t, err)
	_, err = sc.DeleteBefore(ctx, topic, 0, 2)
	require.NoError(t, err)
	cl := newClient(t, []string{ts.addr})

	req := kmsg.NewPtrListOffsetsRequest()
	req.Version = 8
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for _, at := range []int64{-4, -2} {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = 0, at
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	for i, p := range resp.Topics[0].Partitions {
		require.Zero(t, p.ErrorCode, "timestamp %d: %v", rt.Partitions[i].Timestamp, kerr.ErrorForCode(p.ErrorCode))
		require.Equal(t, int64(2), p.Offset, "timestamp %d", rt.Partitions[i].Timestamp)
	}
}
