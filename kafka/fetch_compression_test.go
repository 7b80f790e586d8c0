package kafka

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streamconfig"
)

// rawFetch fetches partition 0 of topic from offset 0 with a raw kmsg request
// (client cl decides the version) and returns its batches' codecs and records.
func rawFetch(t *testing.T, ctx context.Context, cl *kgo.Client, topic string) ([]int8, []kgo.Record) {
	t.Helper()
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID, req.MaxBytes, req.SessionEpoch = -1, 1<<20, -1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, topicID(topic)
	p := kmsg.NewFetchRequestTopicPartition()
	p.PartitionMaxBytes, p.CurrentLeaderEpoch, p.LastFetchedEpoch, p.LogStartOffset = 1<<20, -1, -1, -1
	rt.Partitions = append(rt.Partitions, p)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Len(t, resp.Topics, 1)
	rp := resp.Topics[0].Partitions[0]
	require.Zero(t, rp.ErrorCode)
	var codecs []int8
	raw := rp.RecordBatches
	for len(raw) > 0 {
		var b kmsg.RecordBatch
		require.NoError(t, b.ReadFrom(raw))
		codecs = append(codecs, int8(b.Attributes&attrCodecMask))
		raw = raw[12+int(b.Length):]
	}
	return codecs, recordsOf(t, rp.RecordBatches)
}

// A topic's compression.type (CreateTopics, IncrementalAlterConfigs) is its
// performance_config, and a Fetch of the topic returns batches compressed with it
// that franz-go decodes; a topic that sets nothing follows the server's
// Config.Compression (uncompressed unless set). Records produced uncompressed, so
// that the compression seen is the server's.
func TestFetchCompressesWithTheTopicsCodec(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	adm := newAdmin(t, ts.addr)
	store := streamconfig.NewStore(pool)
	producer := newClient(t, []string{ts.addr}, kgo.ProducerBatchCompression(kgo.NoCompression()))
	raw := newClient(t, []string{ts.addr})

	var values []string
	for i := range 20 {
		values = append(values, strings.Repeat("compressible value "+strconv.Itoa(i)+" ", 10))
	}
	produce := func(topic string) {
		t.Helper()
		recs := make([]*kgo.Record, len(values))
		for i, v := range values {
			recs[i] = &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(v),
				Headers: []kgo.RecordHeader{{Key: "h", Value: []byte{0, 1, 2}}}}
		}
		require.NoError(t, producer.ProduceSync(ctx, recs...).FirstErr())
	}
	requireFetched := func(topic string, codec int8) {
		t.Helper()
		codecs, recs := rawFetch(t, ctx, raw, topic)
		require.NotEmpty(t, codecs)
		for _, c := range codecs {
			require.Equal(t, codec, c, "%s: batch codec", topic)
		}
		require.Len(t, recs, len(values))
		for i, r := range recs {
			require.Equal(t, values[i], string(r.Value))
		}
		// franz-go decodes it, headers and all.
		cl := newClient(t, []string{ts.addr}, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(0)}}))
		var got []*kgo.Record
		for len(got) < len(values) {
			fs := cl.PollFetches(ctx)
			require.NoError(t, fs.Err0())
			got = append(got, fs.Records()...)
		}
		for i, r := range got {
			require.Equal(t, values[i], string(r.Value))
			require.Equal(t, []kgo.RecordHeader{{Key: "h", Value: []byte{0, 1, 2}}}, r.Headers)
		}
	}

	names := map[string]string{} // compression.type → its topic
	for _, tc := range []struct {
		compression string
		codec       int8
	}{
		{"", codecNone}, {"uncompressed", codecNone}, {"producer", codecNone},
		{"gzip", codecGzip}, {"snappy", codecSnappy}, {"lz4", codecLZ4}, {"zstd", codecZstd},
	} {
		topic := testdb.Name("cmp-" + tc.compression)
		names[tc.compression] = topic
		var configs map[string]*string
		if tc.compression != "" {
			configs = map[string]*string{"compression.type": kadm.StringPtr(tc.compression)}
		}
		created, err := adm.CreateTopic(ctx, 1, 1, configs, topic)
		require.NoError(t, err)
		require.NoError(t, created.Err)
		produce(topic)
		requireFetched(topic, tc.codec)
		want := tc.compression
		if want == "" || want == "producer" {
			want = "uncompressed"
		}
		require.Equal(t, want, topicConfig(t, ctx, adm, topic)["compression.type"])
		cfg, err := store.Get(ctx, topic)
		require.NoError(t, err)
		if tc.codec != codecNone {
			require.True(t, *cfg.Performance.EnableCompression, tc.compression)
			require.Equal(t, tc.compression, cfg.Performance.CompressionCodec)
		}
	}

	// IncrementalAlterConfigs changes it for the next fetch; DELETE goes back to the
	// server's default; an unknown codec is INVALID_CONFIG and changes nothing.
	topic := testdb.Name("cmp-alter")
	_, err := adm.CreateTopic(ctx, 1, 1, nil, topic)
	require.NoError(t, err)
	produce(topic)
	requireFetched(topic, codecNone)
	alter := func(op kadm.IncrementalOp, value string) error {
		t.Helper()
		res, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: op, Name: "compression.type", Value: kadm.StringPtr(value)}}, topic)
		require.NoError(t, err)
		return res[0].Err
	}
	require.NoError(t, alter(kadm.SetConfig, "zstd"))
	requireFetched(topic, codecZstd)
	require.Error(t, alter(kadm.SetConfig, "brotli"))
	requireFetched(topic, codecZstd)
	require.NoError(t, alter(kadm.DeleteConfig, ""))
	requireFetched(topic, codecNone)

	// SQL is a door too: seed 003's performance_config (enableCompression true, no
	// codec) serves lz4, streamd's default codec.
	_, err = pool.Exec(ctx, `UPDATE streamd.stream_configurations SET performance_config = '{"batchSize": 1000, "enableCompression": true}' WHERE stream_name = $1`, topic)
	require.NoError(t, err)
	ts.srv.forgetCompression(topic)
	requireFetched(topic, codecLZ4)
	// A change this instance did not make reaches its fetches once the cached entry
	// expired (compressionTTL) and its background refresh read it again; meanwhile
	// fetches go on with the cached codec.
	_, err = pool.Exec(ctx, `UPDATE streamd.stream_configurations SET performance_config = '{"batchSize": 1000, "enableCompression": false}' WHERE stream_name = $1`, topic)
	require.NoError(t, err)
	testdb.WaitFor(t, 20*time.Second, "the refreshed codec", func() bool {
		codecs, _ := rawFetch(t, ctx, raw, topic)
		return len(codecs) > 0 && codecs[0] == codecNone
	})
	requireFetched(topic, codecNone)

	// A Fetch below v10 cannot carry zstd (Kafka's rule): such a client gets the
	// zstd topic's batches uncompressed.
	v9 := kversion.Stable()
	v9.SetMaxKeyVersion(1, 9)
	old := newClient(t, []string{ts.addr}, kgo.MaxVersions(v9))
	codecs, recs := rawFetch(t, ctx, old, names["zstd"])
	require.Equal(t, []int8{codecNone}, codecs)
	require.Len(t, recs, len(values))

	// The server's default applies to the topics that set nothing.
	lz := startServer(t, pool, &Config{Compression: "lz4"})
	lzRaw := newClient(t, []string{lz.addr})
	codecs, _ = rawFetch(t, ctx, lzRaw, names[""])
	require.Equal(t, []int8{codecLZ4}, codecs)
	codecs, _ = rawFetch(t, ctx, lzRaw, names["uncompressed"])
	require.Equal(t, []int8{codecNone}, codecs, "a topic's own uncompressed wins")
	require.Equal(t, "lz4", topicConfig(t, ctx, newAdmin(t, lz.addr), names[""])["compression.type"])
}

// A compressed batch arrives whole (its records up to the partition's byte limit
// counted compressed, as Kafka counts them), so franz-go's decompression limit
// (MaxDecompressBatchBytes) applies: ErrDecompressTooLarge, naming the batch.
func TestFetchDecompressionLimit(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	adm := newAdmin(t, ts.addr)
	topic := testdb.Name("bomb")
	created, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"compression.type": kadm.StringPtr("gzip")}, topic)
	require.NoError(t, err)
	require.NoError(t, created.Err)
	producer := newClient(t, []string{ts.addr}, kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(time.Second), kgo.ProducerBatchMaxBytes(4<<20)) // one batch: one append, one log time
	big := bytes.Repeat([]byte{0}, 512<<10)
	require.NoError(t, producer.ProduceSync(ctx, &kgo.Record{Value: big}, &kgo.Record{Value: big}, &kgo.Record{Value: big}).FirstErr())

	cl := newClient(t, []string{ts.addr}, kgo.MaxDecompressBatchBytes(1<<20),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(0)}}))
	fs := cl.PollFetches(ctx)
	var tooLarge *kgo.ErrDecompressTooLarge
	require.True(t, errors.As(fs.Err0(), &tooLarge), "got %v", fs.Err0())
	require.Equal(t, int64(0), tooLarge.Offset)
	require.Equal(t, int64(3), tooLarge.NextOffset)
}
