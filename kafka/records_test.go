package kafka

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/streams"
)

// eventsBatch is the record batch v2 of recs as kmsg encodes it, with the header
// appendBatches writes for events (one log time), each record's offset delta its
// event's.
func eventsBatch(events []streams.Event, recs []kmsg.Record) []byte {
	first := events[0].Offset
	ts := events[0].Timestamp.UnixMilli()
	for i := range recs {
		recs[i].OffsetDelta = int32(events[i].Offset - first)
	}
	return kmsgBatch(kmsg.RecordBatch{FirstOffset: first, PartitionLeaderEpoch: -1, Attributes: attrLogAppendTime,
		LastOffsetDelta: int32(events[len(events)-1].Offset - first), FirstTimestamp: ts, MaxTimestamp: ts,
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1}, recs)
}

// TestBatchesAreKmsgsEncoding: the batches appendBatches encodes (through kmsg into
// reused buffers, the header last over the room left for it) are, byte for byte,
// kmsg's encoding of the records a consumer must get, each batch encoded whole: a
// text key, a key of bytes (empty), no key; JSON data, bytes, a null value (tombstone); raw headers exactly
// (in their order, a null and an empty value), string headers by key, raw headers
// winning over string ones; lengths and offset deltas of two-byte varints (a value of
// 300 bytes, a hole of 200 offsets); one batch per log time, after what dst held.
func TestBatchesAreKmsgsEncoding(t *testing.T) {
	// Parallel, so after the tests that measure the heap: the compressors it uses
	// leave pooled encoders that take more than one GC to free.
	t.Parallel()
	t0 := time.UnixMilli(1_790_000_000_123)
	t1 := t0.Add(time.Millisecond)
	big := bytes.Repeat([]byte("v"), 300)
	events := []streams.Event{
		{Offset: 1000, Timestamp: t0, Key: "user-1", Data: json.RawMessage(`{"a":1}`)},
		{Offset: 1001, Timestamp: t0, KeyBytes: []byte{}, Bytes: []byte{0, 1, 2}},
		{Offset: 1002, Timestamp: t0}, // no key, tombstone
		{Offset: 1003, Timestamp: t0, KeyBytes: []byte{0xff, 0}, Bytes: []byte("x"),
			RawHeaders: []streams.Header{{Key: "z", Value: []byte("1")}, {Key: "a", Value: nil}, {Key: "", Value: []byte{}}}},
		{Offset: 1004, Timestamp: t0, Key: "k", Data: json.RawMessage(`"s"`), Headers: map[string]string{"b": "2", "a": "1", "c": ""}},
		{Offset: 1005, Timestamp: t0, Bytes: []byte("y"), RawHeaders: []streams.Header{}, Headers: map[string]string{"ignored": "x"}},
		{Offset: 1205, Timestamp: t0, Key: "hole", Bytes: big}, // 200 offsets later
		{Offset: 1206, Timestamp: t1, Bytes: []byte("next batch")},
		{Offset: 1207, Timestamp: t1, Key: "k2"},
	}
	want := [][]kmsg.Record{{
		{Key: []byte("user-1"), Value: []byte(`{"a":1}`)},
		{Key: []byte{}, Value: []byte{0, 1, 2}},
		{},
		{Key: []byte{0xff, 0}, Value: []byte("x"), Headers: []kmsg.Header{{Key: "z", Value: []byte("1")}, {Key: "a"}, {Key: "", Value: []byte{}}}},
		{Key: []byte("k"), Value: []byte(`"s"`), Headers: []kmsg.Header{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("2")}, {Key: "c", Value: []byte{}}}},
		{Value: []byte("y")},
		{Key: []byte("hole"), Value: big},
	}, {
		{Value: []byte("next batch")},
		{Key: []byte("k2")},
	}}
	prefix := []byte("held before")
	expected := append([]byte(nil), prefix...)
	expected = append(expected, eventsBatch(events[:7], want[0])...)
	expected = append(expected, eventsBatch(events[7:], want[1])...)
	got := appendBatches(append([]byte(nil), prefix...), events)
	require.Equal(t, expected, got)

	// Compressed (each codec) and uncompressed, the records are the same bytes.
	for _, codec := range []int8{codecGzip, codecSnappy, codecLZ4, codecZstd} {
		t.Run(fmt.Sprint("codec ", codec), func(t *testing.T) {
			raw := appendCompressedBatches(nil, events, codec, 1<<20)
			for i, w := range want {
				var b kmsg.RecordBatch
				require.NoError(t, b.ReadFrom(raw))
				batch := raw[:b.Length+12]
				raw = raw[b.Length+12:]
				require.Equal(t, crc32.Checksum(batch[21:], crc32c), uint32(b.CRC), "batch %d's CRC", i)
				require.Equal(t, int16(attrLogAppendTime)|int16(codec), b.Attributes)
				recs, err := decompress(b.Attributes&attrCodecMask, b.Records, 1<<20)
				require.NoError(t, err)
				plain := eventsBatch(events[i*7:i*7+len(w)], w)
				var pb kmsg.RecordBatch
				require.NoError(t, pb.ReadFrom(plain))
				require.Equal(t, pb.Records, recs, "batch %d's records", i)
			}
			require.Empty(t, raw)
		})
	}
}

// TestBatchesAllocateOnce: encoding a fetch's records (1,000 small records of one log
// time, as a consumer reading a backlog gets them) allocates the buffer they go into
// and nothing per record. Encoding each record through kmsg into a slice of its own,
// copying the batch, and growing the records' slice from nil allocated
// (3,024 allocations here; growslice was 0.75 of the kafka.Server's 2.11 s of
// CPU in a profile of the bench's consume case).
func TestBatchesAllocateOnce(t *testing.T) {
	ts := time.UnixMilli(1_790_000_000_000)
	events := make([]streams.Event, 1000)
	for i := range events {
		events[i] = streams.Event{Offset: int64(i), Timestamp: ts, Key: fmt.Sprint("key-", i), Data: json.RawMessage(`{"payload":"0123456789abcdef"}`)}
	}
	require.LessOrEqual(t, len(appendBatches(nil, events)), batchesSize(events), "the capacity hint covers what is written")
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops the pooled scratch at random (make test-race): counted by make test")
	}
	allocs := testing.AllocsPerRun(20, func() { appendBatches(nil, events) })
	require.LessOrEqual(t, allocs, 1.0, "allocations to encode 1,000 records")
}

// TestEmptyStringHeaderIsEmptyOnAFreshScratch: a string header whose value is ""
// reaches the consumer as an empty value, not a null one, also when it is the first
// thing a fresh batchScratch (a new one from the pool) copies into its arena.
func TestEmptyStringHeaderIsEmptyOnAFreshScratch(t *testing.T) {
	t.Parallel()
	ts := time.UnixMilli(1_790_000_000_000)
	events := []streams.Event{{Offset: 7, Timestamp: ts, Bytes: []byte("v"), Headers: map[string]string{"a": "", "b": "2"}}}
	want := eventsBatch(events, []kmsg.Record{{Value: []byte("v"), Headers: []kmsg.Header{{Key: "a", Value: []byte{}}, {Key: "b", Value: []byte("2")}}}})
	sc := new(batchScratch)
	got := sc.appendRecords(append([]byte(nil), sc.header[:]...), events)
	sc.putHeader(got, events, codecNone)
	require.Equal(t, want, got)
}

// TestReleasedScratchKeepsNoEvent: a scratch given back to the pool points to none of
// the events it encoded (their header values and keys), so a pooled scratch does not
// keep a fetch's payloads alive.
func TestReleasedScratchKeepsNoEvent(t *testing.T) {
	ts := time.UnixMilli(1_790_000_000_000)
	events := []streams.Event{
		{Offset: 1, Timestamp: ts, Bytes: []byte("v"), RawHeaders: []streams.Header{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("2")}}},
		{Offset: 2, Timestamp: ts, Bytes: []byte("w"), Headers: map[string]string{"x": "1", "y": "2", "z": "3"}},
		{Offset: 3, Timestamp: ts, Bytes: []byte("u"), RawHeaders: []streams.Header{{Key: "c", Value: []byte("3")}}},
	}
	sc := new(batchScratch)
	sc.appendRecords(nil, events)
	sc.forget()
	for i, h := range sc.headers[:cap(sc.headers)] {
		require.Equal(t, kmsg.Header{}, h, "header %d", i)
	}
	for i, k := range sc.keys[:cap(sc.keys)] {
		require.Empty(t, k, "key %d", i)
	}
}
