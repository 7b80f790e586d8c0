package kafka

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// consumeN reads n records of topic from the start with a fresh client.
func consumeN(t *testing.T, ctx context.Context, addr, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := newClient(t, []string{addr}, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond))
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "got %d of %d records", len(out), n)
		for _, e := range fs.Errors() {
			require.NoError(t, e.Err, "fetch %s/%d", e.Topic, e.Partition)
		}
		out = append(out, fs.Records()...)
	}
	require.Len(t, out, n)
	return out
}

// Records produced with each codec come back with the same keys, values (bytes,
// null), headers (ordered, repeated, bytes) and offsets, with the log's time.
func TestRoundTripEveryCodec(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	sc := streams.NewClient(pool, nil)
	codecs := map[string]kgo.CompressionCodec{
		"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(), "snappy": kgo.SnappyCompression(),
		"lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(),
	}
	for name, codec := range codecs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			topic := testdb.Name("codec-" + name)
			require.NoError(t, sc.CreateStream(ctx, topic, 2))
			prod := newClient(t, []string{ts.addr}, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchCompression(codec),
				kgo.RecordPartitioner(kgo.ManualPartitioner()))
			const n = 200
			var sent []*kgo.Record
			for i := range n {
				r := &kgo.Record{Partition: int32(i % 2), Key: []byte(fmt.Sprintf("key-%d", i)),
					Value:   bytes.Repeat([]byte{byte(i), 0, 0xff}, 1+i%50),
					Headers: []kgo.RecordHeader{{Key: "h", Value: []byte{0, byte(i)}}, {Key: "h", Value: nil}, {Key: "e", Value: []byte{}}}}
				if i%37 == 5 {
					r.Value = nil // a tombstone
				}
				sent = append(sent, r)
			}
			before := time.Now().Add(-time.Second)
			require.NoError(t, prod.ProduceSync(ctx, sent...).FirstErr())

			got := consumeN(t, ctx, ts.addr, topic, n)
			byKey := map[string]*kgo.Record{}
			for _, r := range got {
				byKey[string(r.Key)] = r
			}
			for _, s := range sent {
				g := byKey[string(s.Key)]
				require.NotNil(t, g, "record %s", s.Key)
				require.Equal(t, s.Partition, g.Partition)
				require.Equal(t, s.Offset, g.Offset, "the offset the producer was told is the one stored")
				require.Equal(t, s.Value, g.Value)
				require.Equal(t, s.Value == nil, g.Value == nil, "null stays null")
				require.Len(t, g.Headers, 3)
				require.Equal(t, s.Headers[0].Value, g.Headers[0].Value)
				require.Nil(t, g.Headers[1].Value)
				require.NotNil(t, g.Headers[2].Value)
				require.True(t, g.Timestamp.After(before), "LogAppendTime: the log's time")
				require.Equal(t, kgo.RecordAttrs{}.TimestampType()+1, g.Attrs.TimestampType(), "LogAppendTime")
			}
			// The same bytes through the Go client: values are data_bytes.
			res, err := sc.Fetch(ctx, topic, 0, 0, nil)
			require.NoError(t, err)
			require.Equal(t, sent[0].Value, res.Events[0].Bytes)
			require.Equal(t, "key-0", res.Events[0].Key)
		})
	}
}
