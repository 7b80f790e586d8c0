package kafka

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"

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
// v2 at base offset 0 whose CRC (CRC-32C from the attributes on) matches,
// compressed with any of the four codecs, whose records decode exactly (offset
// deltas 0, 1, 2, ...). limit bounds the decompressed size. Errors wrap errCorrupt
// (a batch damaged on the way: a short header, a bad CRC, records that do not
// decompress) or errInvalidRecord (a batch built wrong, its CRC good: records that
// do not decode, as Kafka's DefaultRecord answers).
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
	if b.FirstOffset != 0 { // Kafka's LogValidator: a client's batch starts at base offset 0
		return nil, nil, fmt.Errorf("%w: the batch's base offset is %d, not 0", errInvalidRecord, b.FirstOffset)
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
		return nil, nil, fmt.Errorf("%w: %d records in %d bytes", errInvalidRecord, b.NumRecords, len(data))
	}
	recs := make([]kmsg.Record, b.NumRecords)
	for i := range recs {
		l, n := binary.Varint(data)
		if n <= 0 || l < 0 || int64(len(data)-n) < l {
			return nil, nil, fmt.Errorf("%w: record %d: bad length", errInvalidRecord, i)
		}
		if err := recs[i].ReadFrom(data[:n+int(l)]); err != nil {
			return nil, nil, fmt.Errorf("%w: record %d: %v", errInvalidRecord, i, err)
		}
		if recs[i].OffsetDelta != int32(i) {
			return nil, nil, fmt.Errorf("%w: record %d has offset delta %d", errInvalidRecord, i, recs[i].OffsetDelta)
		}
		data = data[n+int(l):]
	}
	if len(data) != 0 {
		return nil, nil, fmt.Errorf("%w: %d bytes after the last record", errInvalidRecord, len(data))
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
//
// kmsg encodes every record and batch header; what is ours is the buffers: dst is
// grown once to about the size written (batchesSize), and each record is encoded
// into scratch reused across records and calls (batchScratch). Encoding each record
// into a fresh slice, growing the records from nil and copying the batch took a
// third of the kafka.Server's CPU in a profile of the bench's consume case
// (bench/RESULTS.md, session 16).
func appendBatches(dst []byte, events []streams.Event) []byte {
	dst = slices.Grow(dst, batchesSize(events))
	sc := getBatchScratch()
	defer sc.release()
	for start := 0; start < len(events); {
		end := runEnd(events, start)
		// The records go straight after room for the header, which is written last.
		at := len(dst)
		dst = sc.appendRecords(append(dst, sc.header[:]...), events[start:end])
		sc.putHeader(dst[at:], events[start:end], codecNone)
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
// most for records under 16 MiB) and its key, value and headers.
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

// appendBatchOf appends the record batch v2 of events (one log time) whose encoded
// records, compressed with codec, are recs.
func (sc *batchScratch) appendBatchOf(dst []byte, events []streams.Event, codec int8, recs []byte) []byte {
	at := len(dst)
	dst = append(append(dst, sc.header[:]...), recs...)
	sc.putHeader(dst[at:], events, codec)
	return dst
}

// putHeader writes the header of batch, a record batch v2 of events (one log time)
// whose records (compressed with codec) follow its first batchHeaderLen bytes, as
// kmsg encodes it: first offset, length, no leader epoch, magic 2, the codec and
// LogAppendTime, the last offset delta, the log time as first and max timestamp, no
// producer, the record count; then the CRC-32C of everything after the CRC.
func (sc *batchScratch) putHeader(batch []byte, events []streams.Event, codec int8) {
	first := events[0].Offset
	ts := events[0].Timestamp.UnixMilli()
	b := kmsg.RecordBatch{
		FirstOffset:          first,
		Length:               int32(len(batch) - 12),
		PartitionLeaderEpoch: -1,
		Magic:                2,
		Attributes:           attrLogAppendTime | int16(codec),
		LastOffsetDelta:      int32(events[len(events)-1].Offset - first),
		FirstTimestamp:       ts,
		MaxTimestamp:         ts,
		ProducerID:           -1,
		ProducerEpoch:        -1,
		FirstSequence:        -1,
		NumRecords:           int32(len(events)),
	}
	copy(batch, b.AppendTo(sc.header[:0]))
	binary.BigEndian.PutUint32(batch[17:], crc32.Checksum(batch[21:], crc32c))
}

// batchScratch is what encoding a fetch's records reuses: a batch header's
// encoding, one record's encoding, its headers, the sorted keys of string headers,
// and a byte arena for the keys and header values kmsg takes as []byte (a slice of
// it stays valid when a later append moves the arena: the old array is not written
// again).
type batchScratch struct {
	header     [batchHeaderLen]byte
	rec, arena []byte
	headers    []kmsg.Header
	keys       []string
}

var batchScratchPool = sync.Pool{New: func() any { return new(batchScratch) }}

// getBatchScratch takes a scratch from the pool; release gives it back.
func getBatchScratch() *batchScratch { return batchScratchPool.Get().(*batchScratch) }

// release gives sc back to the pool without what it points to: a header's value is a
// slice of the event's payload, often of one buffer holding a whole fetch's payloads,
// which a pooled scratch would otherwise keep alive until its next use.
func (sc *batchScratch) release() {
	sc.forget()
	batchScratchPool.Put(sc)
}

// forget drops sc's references to the events it encoded (its headers and keys).
func (sc *batchScratch) forget() {
	clear(sc.headers[:cap(sc.headers)])
	clear(sc.keys[:cap(sc.keys)])
}

// appendRecords appends the records of events (one batch, whose first offset is
// events[0]'s) to dst as kmsg.Record encodes them, each with its length: kmsg writes
// Length as given, so each record is encoded first (into sc.rec) and its length
// put before it.
func (sc *batchScratch) appendRecords(dst []byte, events []streams.Event) []byte {
	first := events[0].Offset
	for i := range events {
		e := &events[i]
		sc.arena = sc.arena[:0]
		r := kmsg.Record{OffsetDelta: int32(e.Offset - first), Value: eventValue(e), Key: e.KeyBytes, Headers: sc.eventHeaders(e)}
		if e.Key != "" {
			r.Key = sc.bytes(e.Key)
		}
		sc.rec = r.AppendTo(sc.rec[:0])
		body := sc.rec[1:] // AppendTo wrote Length (0, one byte) first
		dst = binary.AppendVarint(dst, int64(len(body)))
		dst = append(dst, body...)
	}
	return dst
}

// bytes returns s's bytes, copied into the arena; never nil (kmsg writes nil as null).
func (sc *batchScratch) bytes(s string) []byte {
	if s == "" {
		return []byte{} // appending nothing to a nil arena (a fresh scratch) gives nil
	}
	at := len(sc.arena)
	sc.arena = append(sc.arena, s...)
	return sc.arena[at:len(sc.arena):len(sc.arena)]
}

// eventHeaders are the raw headers when the record has them (appended over Kafka),
// else the string headers (appended by the Go client or SQL), by key; in sc's
// slices, valid until the next record.
func (sc *batchScratch) eventHeaders(e *streams.Event) []kmsg.Header {
	sc.headers = sc.headers[:0]
	if e.RawHeaders != nil {
		for _, h := range e.RawHeaders {
			sc.headers = append(sc.headers, kmsg.Header{Key: h.Key, Value: h.Value})
		}
		return sc.headers
	}
	if len(e.Headers) == 0 {
		return nil
	}
	sc.keys = sc.keys[:0]
	for k := range e.Headers {
		sc.keys = append(sc.keys, k)
	}
	slices.Sort(sc.keys)
	for _, k := range sc.keys {
		sc.headers = append(sc.headers, kmsg.Header{Key: k, Value: sc.bytes(e.Headers[k])})
	}
	return sc.headers
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
