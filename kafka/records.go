package kafka

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/internal/pgtext"
	"github.com/streamd/streamd/streams"
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// Batch attribute bits.
const (
	attrCodecMask     = 0x07
	attrLogAppendTime = 0x08
	attrTransactional = 0x10
	attrControl       = 0x20
)

// batchHeaderLen is the size of a v2 record batch before its records.
const batchHeaderLen = 61

// errInvalidRecord: a batch that decodes but that Kafka refuses (INVALID_RECORD).
var errInvalidRecord = errors.New("invalid record")

// decodeBatch decodes the records of a Produce partition: exactly one RecordBatch
// v2 whose CRC (CRC-32C from the attributes on) matches, compressed with any of the
// four codecs, whose records decode exactly (offset deltas 0, 1, 2, ...). limit
// bounds the decompressed size. Errors wrap errCorrupt or errInvalidRecord.
func decodeBatch(raw []byte, limit int) (*kmsg.RecordBatch, []kmsg.Record, error) {
	if len(raw) < batchHeaderLen {
		return nil, nil, fmt.Errorf("%w: %d bytes is shorter than a record batch header", errCorrupt, len(raw))
	}
	if magic := int8(raw[16]); magic != 2 {
		return nil, nil, fmt.Errorf("%w: message format v%d: only record batches v2 are accepted", errInvalidRecord, magic)
	}
	var b kmsg.RecordBatch
	if err := b.ReadFrom(raw); err != nil || b.Length < batchHeaderLen-12 {
		return nil, nil, fmt.Errorf("%w: record batch header: length %d of %d bytes", errCorrupt, b.Length, len(raw))
	}
	if int(b.Length)+12 != len(raw) {
		return nil, nil, fmt.Errorf("%w: a produce partition must hold exactly one record batch (%d bytes, the first is %d)",
			errInvalidRecord, len(raw), int(b.Length)+12)
	}
	if got := crc32.Checksum(raw[21:], crc32c); got != uint32(b.CRC) {
		return nil, nil, fmt.Errorf("%w: CRC %08x, computed %08x", errCorrupt, uint32(b.CRC), got)
	}
	if b.Attributes&(attrTransactional|attrControl) != 0 {
		return nil, nil, fmt.Errorf("%w: transactional and control batches are not supported", errInvalidRecord)
	}
	if b.NumRecords < 1 || b.LastOffsetDelta != b.NumRecords-1 {
		return nil, nil, fmt.Errorf("%w: %d records with last offset delta %d", errInvalidRecord, b.NumRecords, b.LastOffsetDelta)
	}
	data, err := decompress(b.Attributes&attrCodecMask, b.Records, limit)
	if err != nil {
		return nil, nil, err
	}
	// Each record takes at least 7 bytes: a bogus count cannot make us allocate.
	if int(b.NumRecords) > len(data)/7+1 {
		return nil, nil, fmt.Errorf("%w: %d records in %d bytes", errCorrupt, b.NumRecords, len(data))
	}
	recs := make([]kmsg.Record, b.NumRecords)
	for i := range recs {
		l, n := binary.Varint(data)
		if n <= 0 || l < 0 || int64(len(data)-n) < l {
			return nil, nil, fmt.Errorf("%w: record %d: bad length", errCorrupt, i)
		}
		if err := recs[i].ReadFrom(data[:n+int(l)]); err != nil {
			return nil, nil, fmt.Errorf("%w: record %d: %v", errCorrupt, i, err)
		}
		if recs[i].OffsetDelta != int32(i) {
			return nil, nil, fmt.Errorf("%w: record %d has offset delta %d", errInvalidRecord, i, recs[i].OffsetDelta)
		}
		data = data[n+int(l):]
	}
	if len(data) != 0 {
		return nil, nil, fmt.Errorf("%w: %d bytes after the last record", errCorrupt, len(data))
	}
	return &b, recs, nil
}

// toStreamRecords turns Kafka records into streamd records: the key as text when it
// is UTF-8 text without NUL bytes (so SQL, partitioning by key and the Go client see
// it as any other key), else, and when it is empty, as bytes exactly (KeyBytes); the
// value as bytes (null: a tombstone), the headers exactly.
func toStreamRecords(recs []kmsg.Record) []streams.Record {
	out := make([]streams.Record, len(recs))
	for i := range recs {
		r := &recs[i]
		switch {
		case r.Key == nil:
		case len(r.Key) > 0 && pgtext.TextProblem(string(r.Key)) == "":
			out[i].Key = string(r.Key)
		default:
			out[i].KeyBytes = r.Key
		}
		out[i].Bytes = r.Value
		if len(r.Headers) > 0 {
			out[i].RawHeaders = make([]streams.Header, len(r.Headers))
			for j, h := range r.Headers {
				out[i].RawHeaders[j] = streams.Header{Key: h.Key, Value: h.Value}
			}
		}
	}
	return out
}

// appendBatches appends events as record batches v2 to dst, uncompressed, with
// LogAppendTime timestamps: one batch per run of events with the same log time (a
// produced batch has one), so each record reports its own time. Holes left by
// compaction or retention stay holes (offset deltas skip them).
func appendBatches(dst []byte, events []streams.Event) []byte {
	for start := 0; start < len(events); {
		end := start + 1
		for end < len(events) && events[end].Timestamp.Equal(events[start].Timestamp) {
			end++
		}
		dst = appendBatch(dst, events[start:end])
		start = end
	}
	return dst
}

func appendBatch(dst []byte, events []streams.Event) []byte {
	first := events[0].Offset
	ts := events[0].Timestamp.UnixMilli()
	var recs []byte
	for i := range events {
		e := &events[i]
		r := kmsg.Record{OffsetDelta: int32(e.Offset - first), Value: eventValue(e), Headers: eventHeaders(e), Key: e.KeyBytes}
		if e.Key != "" {
			r.Key = []byte(e.Key)
		}
		recs = appendRecord(recs, &r)
	}
	b := kmsg.RecordBatch{
		FirstOffset:          first,
		PartitionLeaderEpoch: -1,
		Magic:                2,
		Attributes:           attrLogAppendTime,
		LastOffsetDelta:      int32(events[len(events)-1].Offset - first),
		FirstTimestamp:       ts,
		MaxTimestamp:         ts,
		ProducerID:           -1,
		ProducerEpoch:        -1,
		FirstSequence:        -1,
		NumRecords:           int32(len(events)),
		Records:              recs,
	}
	b.Length = int32(batchHeaderLen - 12 + len(recs))
	start := len(dst)
	dst = b.AppendTo(dst)
	binary.BigEndian.PutUint32(dst[start+17:], crc32.Checksum(dst[start+21:], crc32c))
	return dst
}

// appendRecord encodes r with its length, computed here (kmsg writes Length as given).
func appendRecord(dst []byte, r *kmsg.Record) []byte {
	body := r.AppendTo(nil)
	// AppendTo wrote r.Length (0, one byte) first: replace it with the body's length.
	body = body[1:]
	dst = binary.AppendVarint(dst, int64(len(body)))
	return append(dst, body...)
}

// eventValue is what a Kafka consumer gets as the value: the bytes, or the JSON
// data's bytes, or null for a tombstone.
func eventValue(e *streams.Event) []byte {
	switch {
	case e.Bytes != nil:
		return e.Bytes
	case e.Data != nil:
		return []byte(e.Data)
	}
	return nil
}

// eventHeaders are the raw headers when the record has them (appended over Kafka),
// else the string headers (appended by the Go client or SQL), by key.
func eventHeaders(e *streams.Event) []kmsg.Header {
	if e.RawHeaders != nil {
		out := make([]kmsg.Header, len(e.RawHeaders))
		for i, h := range e.RawHeaders {
			out[i] = kmsg.Header{Key: h.Key, Value: h.Value}
		}
		return out
	}
	if len(e.Headers) == 0 {
		return nil
	}
	keys := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]kmsg.Header, len(keys))
	for i, k := range keys {
		out[i] = kmsg.Header{Key: k, Value: []byte(e.Headers[k])}
	}
	return out
}
