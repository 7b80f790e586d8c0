package kafka

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
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
	dst = slices.Grow(dst, batchesSize(events))
	for start := 0; start < len(events); {
		end := runEnd(events, start)
		at := len(dst)
		dst = slices.Grow(dst, batchHeaderLen) // room for the header, written last
		dst = appendRecords(dst[:at+batchHeaderLen], events[start:end])
		putBatchHeader(dst[at:], events[start:end], codecNone)
		start = end
	}
	return dst
}

// runEnd is the end of the run of events with the log time of events[start].
func runEnd(events []streams.Event, start int) int {
	end := start + 1
	for end < len(events) && events[end].Timestamp.Equal(events[start].Timestamp) {
		end++
	}
	return end
}

// batchesSize is about the bytes appendBatches writes for events, as a capacity
// hint: a batch header per log time, a record's framing (varints of 30 bytes at
// most for records under 16 MiB) and its key, value and headers. The records are
// encoded straight into one buffer of about this size, without a copy of each
// record or of the batch (kmsg's Record and RecordBatch encoding made both, and grew
// the records' slice from nil: a third of the kafka.Server's CPU in a profile of the
// bench's consume case, bench/RESULTS.md session 16).
func batchesSize(events []streams.Event) int {
	n := 0
	for i := range events {
		e := &events[i]
		if i == 0 || !e.Timestamp.Equal(events[i-1].Timestamp) {
			n += batchHeaderLen
		}
		n += 30 + e.Size()
		for _, h := range e.RawHeaders {
			n += 10 + len(h.Key) + len(h.Value)
		}
		for k, v := range e.Headers {
			n += 10 + len(k) + len(v)
		}
	}
	return n
}

// putBatchHeader writes the header of b, a record batch v2 whose records (those of
// events, one log time, compressed with codec) follow the header's batchHeaderLen
// bytes: first offset, length, no leader epoch, magic 2, attributes (codec,
// LogAppendTime), last offset delta, the log time as first and max timestamp, no
// producer, the record count, and the CRC-32C of everything after it.
func putBatchHeader(b []byte, events []streams.Event, codec int8) {
	be := binary.BigEndian
	first := events[0].Offset
	ts := uint64(events[0].Timestamp.UnixMilli())
	be.PutUint64(b[0:], uint64(first))
	be.PutUint32(b[8:], uint32(len(b)-12))
	be.PutUint32(b[12:], math.MaxUint32) // partition leader epoch -1
	b[16] = 2                            // magic
	be.PutUint16(b[21:], uint16(attrLogAppendTime|int16(codec)))
	be.PutUint32(b[23:], uint32(events[len(events)-1].Offset-first))
	be.PutUint64(b[27:], ts)
	be.PutUint64(b[35:], ts)
	be.PutUint64(b[43:], math.MaxUint64) // producer id -1
	be.PutUint16(b[51:], math.MaxUint16) // producer epoch -1
	be.PutUint32(b[53:], math.MaxUint32) // first sequence -1
	be.PutUint32(b[57:], uint32(len(events)))
	be.PutUint32(b[17:], crc32.Checksum(b[21:], crc32c))
}

// appendRecords appends the records of events (of one batch, whose first offset is
// events[0]'s) to dst as Kafka encodes them (kmsg.Record's encoding, with its
// length): attributes 0, timestamp delta 0, the offset delta, the key, the value
// (eventValue) and the headers (eventHeaders' order), each record's length computed
// first so that it is written in place.
func appendRecords(dst []byte, events []streams.Event) []byte {
	first := events[0].Offset
	var keys []string // the sorted header keys of a record with string headers
	for i := range events {
		e := &events[i]
		delta := e.Offset - first
		value := eventValue(e)
		keys = keys[:0]
		if e.RawHeaders == nil && len(e.Headers) > 0 {
			for k := range e.Headers {
				keys = append(keys, k)
			}
			slices.Sort(keys)
		}
		// Attributes and timestamp delta (0): a byte each.
		body := 2 + varintLen(delta) + keyLen(e) + bytesLen(value)
		nh := len(e.RawHeaders) + len(keys)
		body += varintLen(int64(nh))
		for _, h := range e.RawHeaders {
			body += varintLen(int64(len(h.Key))) + len(h.Key) + bytesLen(h.Value)
		}
		for _, k := range keys {
			v := e.Headers[k]
			body += varintLen(int64(len(k))) + len(k) + varintLen(int64(len(v))) + len(v)
		}
		dst = binary.AppendVarint(dst, int64(body))
		dst = append(dst, 0, 0)
		dst = binary.AppendVarint(dst, delta)
		dst = appendKey(dst, e)
		dst = appendBytes(dst, value)
		dst = binary.AppendVarint(dst, int64(nh))
		for _, h := range e.RawHeaders {
			dst = binary.AppendVarint(dst, int64(len(h.Key)))
			dst = append(dst, h.Key...)
			dst = appendBytes(dst, h.Value)
		}
		for _, k := range keys {
			v := e.Headers[k]
			dst = binary.AppendVarint(dst, int64(len(k)))
			dst = append(dst, k...)
			dst = binary.AppendVarint(dst, int64(len(v)))
			dst = append(dst, v...)
		}
	}
	return dst
}

// varintLen is the size of v as a zigzag varint.
func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

// bytesLen is the size of b as Kafka's varint-prefixed bytes (null: length -1).
func bytesLen(b []byte) int {
	if b == nil {
		return 1
	}
	return varintLen(int64(len(b))) + len(b)
}

// appendBytes appends b as Kafka's varint-prefixed bytes (null: length -1).
func appendBytes(dst, b []byte) []byte {
	if b == nil {
		return binary.AppendVarint(dst, -1)
	}
	dst = binary.AppendVarint(dst, int64(len(b)))
	return append(dst, b...)
}

// keyLen and appendKey are the size and the encoding of what a Kafka consumer gets
// as the key: the text key's bytes, the key stored as bytes, or null.
func keyLen(e *streams.Event) int {
	if e.Key != "" {
		return varintLen(int64(len(e.Key))) + len(e.Key)
	}
	return bytesLen(e.KeyBytes)
}

func appendKey(dst []byte, e *streams.Event) []byte {
	if e.Key != "" {
		dst = binary.AppendVarint(dst, int64(len(e.Key)))
		return append(dst, e.Key...)
	}
	return appendBytes(dst, e.KeyBytes)
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
