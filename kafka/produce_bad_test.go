package kafka

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// appendRecord encodes r with its length, computed here (kmsg writes Length as given).
func appendRecord(dst []byte, r *kmsg.Record) []byte {
	body := r.AppendTo(nil)
	// AppendTo wrote r.Length (0, one byte) first: replace it with the body's length.
	body = body[1:]
	dst = binary.AppendVarint(dst, int64(len(body)))
	return append(dst, body...)
}

// rawBatch is an uncompressed record batch v2 of the given records (CRC computed).
func rawBatch(recs ...kmsg.Record) []byte {
	for i := range recs {
		recs[i].OffsetDelta = int32(i)
	}
	return kmsgBatch(kmsg.RecordBatch{PartitionLeaderEpoch: -1, LastOffsetDelta: int32(len(recs) - 1),
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1}, recs)
}

// kmsgBatch is b with recs as its records, as kmsg encodes it: magic 2, the records
// with their lengths (appendRecord), the count, the length and the CRC set.
func kmsgBatch(b kmsg.RecordBatch, recs []kmsg.Record) []byte {
	var body []byte
	for i := range recs {
		body = appendRecord(body, &recs[i])
	}
	b.Magic, b.NumRecords, b.Records = 2, int32(len(recs)), body
	b.Length = int32(batchHeaderLen - 12 + len(body))
	out := b.AppendTo(nil)
	binary.BigEndian.PutUint32(out[17:], crc32.Checksum(out[21:], crc32c))
	return out
}

// recordsBatch is a record batch v2 with the attributes given (codecNone: the
// records uncompressed) claiming n records whose records are the bytes given, CRC
// computed.
func recordsBatch(attrs int16, n int32, records []byte) []byte {
	b := kmsg.RecordBatch{PartitionLeaderEpoch: -1, Magic: 2, Attributes: attrs, LastOffsetDelta: n - 1, ProducerID: -1, ProducerEpoch: -1,
		FirstSequence: -1, NumRecords: n, Records: records, Length: int32(batchHeaderLen - 12 + len(records))}
	out := b.AppendTo(nil)
	binary.BigEndian.PutUint32(out[17:], crc32.Checksum(out[21:], crc32c))
	return out
}

// produceBatch sends batch to partition 0 of topic in a Produce with acks -1 and
// returns the answer.
func produceBatch(t *testing.T, ctx context.Context, cl *kgo.Client, topic string, batch []byte) *kmsg.ProduceResponse {
	t.Helper()
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, 10000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	p := kmsg.NewProduceRequestTopicPartition()
	p.Records = batch
	rt.Partitions = append(rt.Partitions, p)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	return resp
}

// A batch that cannot be stored gets its Kafka error code and writes nothing, while
// a good batch of another partition in the same request is stored.
func TestBadBatchesWriteNothing(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("bad")
	require.NoError(t, sc.CreateStream(ctx, topic, 2))
	jsonTopic := testdb.Name("json")
	require.NoError(t, sc.CreateStream(ctx, jsonTopic, 1))
	require.NoError(t, sc.SetValueFormat(ctx, jsonTopic, "json"))
	cl := newClient(t, []string{ts.addr})

	good := rawBatch(kmsg.Record{Value: []byte(`{"ok":1}`)})
	corrupt := rawBatch(kmsg.Record{Value: []byte("x")}, kmsg.Record{Value: []byte("y")})
	corrupt[len(corrupt)-1] ^= 0xff
	cases := []struct {
		name  string
		topic string
		acks  int16
		batch []byte
		want  *kerr.Error
	}{
		{"CRC mismatch", topic, -1, corrupt, kerr.CorruptMessage},
		{"not JSON on a JSON stream", jsonTopic, -1, rawBatch(kmsg.Record{Value: []byte(`{"a":1}`)}, kmsg.Record{Value: []byte("not json")}), kerr.InvalidRecord},
		{"over max.message.bytes", topic, -1, rawBatch(kmsg.Record{Value: []byte("a")}, kmsg.Record{Value: make([]byte, 1<<20+1)}), kerr.MessageTooLarge},
		{"two batches", topic, -1, append(rawBatch(kmsg.Record{Value: []byte("a")}), rawBatch(kmsg.Record{Value: []byte("b")})...), kerr.InvalidRecord},
		{"a short batch", topic, -1, good[:40], kerr.CorruptMessage},
		// A batch whose CRC holds but whose records do not decode was built wrong,
		// not damaged on the way: Kafka's DefaultRecord answers INVALID_RECORD (not
		// CORRUPT_MESSAGE, which a client retries).
		{"a record that does not decode", topic, -1, recordsBatch(codecNone, 1, []byte{3 << 1, 0, 0xff, 0xff}), kerr.InvalidRecord},
		{"bytes after the last record", topic, -1, recordsBatch(codecNone, 1, append(appendRecord(nil, &kmsg.Record{Value: []byte("a")}), 0, 0)), kerr.InvalidRecord},
		// Kafka's LogValidator: a client's batch v2 starts at base offset 0.
		{"base offset not 0", topic, -1, kmsgBatch(kmsg.RecordBatch{FirstOffset: 5, PartitionLeaderEpoch: -1,
			ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1}, []kmsg.Record{{Value: []byte("a")}}), kerr.InvalidRecord},
	}
	for _, tc := range cases {
		req := kmsg.NewPtrProduceRequest()
		req.Acks = tc.acks
		req.TimeoutMillis = 10000
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic = tc.topic
		bad := kmsg.NewProduceRequestTopicPartition()
		bad.Partition, bad.Records = 0, tc.batch
		goodP := kmsg.NewProduceRequestTopicPartition()
		goodP.Partition, goodP.Records = 1, rawBatch(kmsg.Record{Value: []byte(`{"ok":1}`)})
		rt.Partitions = append(rt.Partitions, bad)
		if tc.topic == topic {
			rt.Partitions = append(rt.Partitions, goodP)
		}
		req.Topics = append(req.Topics, rt)
		kresp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err, tc.name)
		parts := kresp.Topics[0].Partitions
		require.Equal(t, tc.want.Code, parts[0].ErrorCode, "%s: got %v", tc.name, kerr.ErrorForCode(parts[0].ErrorCode))
		if len(parts) > 1 {
			require.Zero(t, parts[1].ErrorCode, tc.name)
		}
	}
	for _, name := range []string{topic, jsonTopic} {
		info, err := sc.DescribeStream(ctx, name)
		require.NoError(t, err)
		require.Equal(t, int64(0), info.PartitionInfo[0].NextOffset, "%s: the bad batches wrote nothing", name)
	}

	// A JSON stream stores good values as data, where SQL can query them.
	kresp := produceBatch(t, ctx, cl, jsonTopic, good)
	require.Zero(t, kresp.Topics[0].Partitions[0].ErrorCode)
	var ok int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (data->>'ok')::int FROM streamd.events WHERE stream_name = $1`, jsonTopic).Scan(&ok))
	require.Equal(t, 1, ok)
}

// TestZstdNeedsProduceV7: a zstd batch in a Produce below v7 is
// UNSUPPORTED_COMPRESSION_TYPE and writes nothing, as Kafka's
// ProduceRequest.validateRecords refuses it (a client may send zstd only once the
// broker lists Produce v7); the same batch at v7 is stored.
func TestZstdNeedsProduceV7(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("zstdv6")
	require.NoError(t, sc.CreateStream(ctx, topic, 1))
	v6 := kversion.Stable()
	v6.SetMaxKeyVersion(0, 6) // Produce
	clients := map[int16]*kgo.Client{6: newClient(t, []string{ts.addr}, kgo.MaxVersions(v6)), 7: newClient(t, []string{ts.addr})}

	var body bytes.Buffer
	rec := kmsg.Record{Value: bytes.Repeat([]byte("z"), 100)}
	zrecs := compressRecords(codecZstd, appendRecord(nil, &rec), &body)
	require.NotNil(t, zrecs)
	batch := recordsBatch(codecZstd, 1, zrecs)

	for _, v := range []int16{6, 7} {
		resp := produceBatch(t, ctx, clients[v], topic, batch)
		require.Equal(t, v == 6, resp.GetVersion() == 6, "sent as v%d", resp.GetVersion())
		code := resp.Topics[0].Partitions[0].ErrorCode
		info, err := sc.DescribeStream(ctx, topic)
		require.NoError(t, err)
		if v == 6 {
			require.Equal(t, kerr.UnsupportedCompressionType.Code, code, "v6: %v", kerr.ErrorForCode(code))
			require.Equal(t, int64(0), info.PartitionInfo[0].NextOffset, "v6 wrote nothing")
		} else {
			require.Zero(t, code, "v7: %v", kerr.ErrorForCode(code))
			require.Equal(t, int64(1), info.PartitionInfo[0].NextOffset)
		}
	}
}

// TestCompactedTopicTakesOnlyKeyedRecords: a record without a key (null; an empty
// key is a key) produced to a topic whose cleanup.policy compacts is INVALID_RECORD
// and nothing of its batch is written, as Kafka's LogValidator refuses it; keyed
// batches are stored, and a delete topic takes keyless records.
func TestCompactedTopicTakesOnlyKeyedRecords(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	cl := newClient(t, []string{ts.addr})
	adm := kadm.NewClient(cl)
	keyless := rawBatch(kmsg.Record{Key: []byte("k"), Value: []byte("a")}, kmsg.Record{Value: []byte("b")})
	keyed := rawBatch(kmsg.Record{Key: []byte("k"), Value: []byte("a")}, kmsg.Record{Key: []byte{}, Value: []byte("b")})
	for _, policy := range []string{"compact", "compact,delete", "delete"} {
		topic := testdb.Name("compacted")
		require.NoError(t, sc.CreateStream(ctx, topic, 1))
		require.Zero(t, produceBatch(t, ctx, cl, topic, keyed).Topics[0].Partitions[0].ErrorCode)
		alter, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "cleanup.policy", Value: &policy}}, topic)
		require.NoError(t, err)
		require.NoError(t, alter[0].Err)

		code := produceBatch(t, ctx, cl, topic, keyless).Topics[0].Partitions[0].ErrorCode
		info, err := sc.DescribeStream(ctx, topic)
		require.NoError(t, err)
		if policy == "delete" {
			require.Zero(t, code, "%s: %v", policy, kerr.ErrorForCode(code))
			require.Equal(t, int64(4), info.PartitionInfo[0].NextOffset, policy)
			continue
		}
		require.Equal(t, kerr.InvalidRecord.Code, code, "%s: %v", policy, kerr.ErrorForCode(code))
		require.Equal(t, int64(2), info.PartitionInfo[0].NextOffset, "%s: the keyless batch wrote nothing", policy)
		require.Zero(t, produceBatch(t, ctx, cl, topic, keyed).Topics[0].Partitions[0].ErrorCode, policy)
	}
}
