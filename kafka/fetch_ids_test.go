package kafka

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// Fetch v13+ names topics by id (KIP-516): the id Metadata gave the topic reads it,
// a topic created after the server cached the ids is found, and an id no stream has
// is UNKNOWN_TOPIC_ID; v12 still reads by name.
func TestFetchByTopicID(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	// kgo sends the highest version both sides support (16 here); the other client
	// is held to v12.
	v12 := kversion.Stable()
	v12.SetMaxKeyVersion(1, 12)
	clients := map[int16]*kgo.Client{16: newClient(t, []string{ts.addr}), 12: newClient(t, []string{ts.addr}, kgo.MaxVersions(v12))}
	fetch := func(version int16, topic string, id [16]byte) kmsg.FetchResponseTopic {
		t.Helper()
		cl := clients[version]
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID, req.MaxBytes, req.SessionEpoch = -1, 1<<20, -1
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = topic, id
		p := kmsg.NewFetchRequestTopicPartition()
		p.PartitionMaxBytes, p.CurrentLeaderEpoch, p.LastFetchedEpoch, p.LogStartOffset = 1<<20, -1, -1, -1
		rt.Partitions = append(rt.Partitions, p)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		require.Zero(t, resp.ErrorCode)
		require.Len(t, resp.Topics, 1)
		return resp.Topics[0]
	}
	for _, name := range []string{"first", "second"} { // the second after the ids were cached
		topic := testdb.Name("ids-" + name)
		require.NoError(t, sc.CreateStream(ctx, topic, 1))
		_, err := sc.AppendPartition(ctx, topic, 0, []streams.Record{{Key: "k", Bytes: []byte("v-" + name)}}, nil)
		require.NoError(t, err)
		got := fetch(16, "", topicID(topic))
		require.Equal(t, topicID(topic), got.TopicID)
		require.Zero(t, got.Partitions[0].ErrorCode, kerr.ErrorForCode(got.Partitions[0].ErrorCode))
		require.Equal(t, int64(1), got.Partitions[0].HighWatermark)
		recs := recordsOf(t, got.Partitions[0].RecordBatches)
		require.Len(t, recs, 1)
		require.Equal(t, "v-"+name, string(recs[0].Value))

		byName := fetch(12, topic, [16]byte{})
		require.Zero(t, byName.Partitions[0].ErrorCode, kerr.ErrorForCode(byName.Partitions[0].ErrorCode))
		require.Len(t, recordsOf(t, byName.Partitions[0].RecordBatches), 1)
	}
	unknown := fetch(16, "", topicID(testdb.Name("no-such-topic")))
	require.Equal(t, kerr.UnknownTopicID.Code, unknown.Partitions[0].ErrorCode)
}

// recordsOf decodes fetched record batches, compressed or not.
func recordsOf(t *testing.T, raw []byte) []kgo.Record {
	t.Helper()
	var out []kgo.Record
	for len(raw) > 0 {
		var b kmsg.RecordBatch
		require.NoError(t, b.ReadFrom(raw))
		raw = raw[12+int(b.Length):]
		data, err := decompress(b.Attributes&attrCodecMask, b.Records, 64<<20)
		require.NoError(t, err)
		for range b.NumRecords {
			var r kmsg.Record
			l, n := varint(data)
			require.NoError(t, r.ReadFrom(data[:n+l]))
			data = data[n+l:]
			out = append(out, kgo.Record{Key: r.Key, Value: r.Value})
		}
	}
	return out
}

func varint(b []byte) (int, int) {
	var x uint64
	var s uint
	for i, c := range b {
		x |= uint64(c&0x7f) << s
		if c < 0x80 {
			return int(int64(x>>1) ^ -int64(x&1)), i + 1
		}
		s += 7
	}
	return 0, 0
}
