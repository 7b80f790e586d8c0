package streams

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The columns of fetchSQL, in order, and the types the fast decoder expects.
var fetchColumnOIDs = [...]uint32{
	pgtype.Int8OID, pgtype.Int8OID, // log_start_offset, next_offset
	pgtype.Int8OID, pgtype.TextOID, pgtype.TextOID, pgtype.TextOID, // offset, event_id, event_type, key
	pgtype.JSONBOID, pgtype.ByteaOID, pgtype.JSONBOID, // data, data_bytes, metadata
	pgtype.TimestamptzOID, pgtype.TextOID, pgtype.TextOID, pgtype.Int4OID, // timestamp, correlation_id, causation_id, version
	pgtype.TextArrayOID, pgtype.ByteaArrayOID, // header_keys, header_values
	pgtype.ByteaOID, // key_bytes
}

// fetchDecoder turns fetchSQL's rows into Events. When every column arrives with
// the expected type, and the numbers, times and bytes in PostgreSQL's binary format
// (pgx's default; it reads text and jsonb as text), it decodes the raw values itself and copies each row's bytes into buffers shared by the whole
// fetch, for the payloads (Data, Bytes and KeyBytes are slices of them: a first one
// of payloadFirst, then one sized for the rows expected, doubling past it) and one for the
// strings (converted to one string at the end, of which the events' strings are
// substrings): a few allocations per fetch instead of about ten per event, which were
// most of a fetch's client CPU (issue 21). Otherwise (another query mode, a type
// map that changes formats) it scans each row as pgx does. The events of one fetch
// share those buffers, so an event kept after its batch keeps its fetch's buffers
// alive.
type fetchDecoder struct {
	fast         bool
	extra        int                        // columns after fetchColumnOIDs' (scan skips them)
	jsonbBinary  [len(fetchColumnOIDs)]bool // per column: jsonb in the binary format (a version byte first)
	arrayFormats [2]int16                   // of header_keys and header_values
	tm           *pgtype.Map
	location     *time.Location // the type map's timestamptz ScanLocation (nil: local time)

	payload []byte
	kept    int // the payload bytes kept so far
	want    int // the payload bytes the fetch's rows will need, as expect guessed (0: not guessed)
	strs    []byte
	spans   []strSpans // per event, where its strings are in strs
}

// strSpans are the [start, end) positions in fetchDecoder.strs of an event's strings:
// event id, type, key, correlation id, causation id.
type strSpans [5][2]int32

func newFetchDecoder(rows pgx.Rows) *fetchDecoder {
	d := &fetchDecoder{tm: rows.Conn().TypeMap()}
	fds := rows.FieldDescriptions()
	// fetchPartitionsSQL has one more column, after these: the fast decoding reads
	// only these, and scan skips it.
	if len(fds) != len(fetchColumnOIDs) && len(fds) != len(fetchColumnOIDs)+1 {
		return d
	}
	d.extra = len(fds) - len(fetchColumnOIDs)
	for i, fd := range fds[:len(fetchColumnOIDs)] {
		if fd.DataTypeOID != fetchColumnOIDs[i] {
			return d
		}
		switch fd.DataTypeOID {
		case pgtype.TextOID, pgtype.TextArrayOID, pgtype.ByteaArrayOID:
			// Text is the same bytes in both formats; pgx decodes the arrays.
		case pgtype.JSONBOID:
			d.jsonbBinary[i] = fd.Format == pgtype.BinaryFormatCode
		default:
			if fd.Format != pgtype.BinaryFormatCode {
				return d
			}
		}
	}
	d.arrayFormats = [2]int16{fds[13].Format, fds[14].Format}
	if t, ok := d.tm.TypeForOID(pgtype.TimestamptzOID); ok {
		if c, ok := t.Codec.(*pgtype.TimestamptzCodec); ok {
			d.location = c.ScanLocation
		} else {
			return d // a codec of the program's own: let pgx scan
		}
	}
	d.fast = true
	return d
}

// row decodes the current row into e (its strings are set by finish) and returns
// e.Size(). It reports hasEvent false for the one row of a partition without events
// at the offset.
func (d *fetchDecoder) row(rows pgx.Rows, res *FetchResult, e *Event) (size int, hasEvent bool, err error) {
	if !d.fast {
		hasEvent, err = d.scan(rows, res, e)
		return e.Size(), hasEvent, err
	}
	hasEvent, err = d.decode(rows.RawValues(), res, e)
	return len(e.Data) + len(e.Bytes) + len(rows.RawValues()[5]) + len(e.KeyBytes), hasEvent, err
}

func (d *fetchDecoder) decode(v [][]byte, res *FetchResult, e *Event) (hasEvent bool, err error) {
	res.LogStartOffset, err = int8Value(v[0])
	if err != nil {
		return false, err
	}
	if res.HighWatermark, err = int8Value(v[1]); err != nil {
		return false, err
	}
	if v[2] == nil {
		return false, nil
	}
	if e.Offset, err = int8Value(v[2]); err != nil {
		return false, err
	}
	var sp strSpans
	for i, col := range [5]int{3, 4, 5, 10, 11} {
		start := len(d.strs)
		d.strs = append(d.strs, v[col]...)
		sp[i] = [2]int32{int32(start), int32(len(d.strs))}
	}
	d.spans = append(d.spans, sp)
	if v[6] != nil {
		raw, err := d.jsonb(6, v[6])
		if err != nil {
			return false, err
		}
		e.Data = json.RawMessage(d.keep(raw))
	}
	if v[7] != nil {
		e.Bytes = d.keep(v[7])
	}
	if v[15] != nil {
		e.KeyBytes = d.keep(v[15])
	}
	if v[8] != nil {
		raw, err := d.jsonb(8, v[8])
		if err != nil {
			return false, err
		}
		e.Headers = decodeHeaders(raw)
	}
	if len(v[9]) != 8 {
		return false, fmt.Errorf("timestamp: %d bytes", len(v[9]))
	}
	us := int64(binary.BigEndian.Uint64(v[9]))
	if us == math.MaxInt64 || us == math.MinInt64 {
		return false, fmt.Errorf("timestamp: infinity")
	}
	e.Timestamp = time.Unix(946_684_800+us/1_000_000, us%1_000_000*1_000)
	if d.location != nil {
		e.Timestamp = e.Timestamp.In(d.location)
	}
	if len(v[12]) != 4 {
		return false, fmt.Errorf("version: %d bytes", len(v[12]))
	}
	e.Version = int32(binary.BigEndian.Uint32(v[12]))
	if v[13] != nil { // rare (Kafka's headers): pgx decodes the arrays
		var hkeys []string
		var hvals [][]byte
		if err := d.tm.Scan(pgtype.TextArrayOID, d.arrayFormats[0], v[13], &hkeys); err != nil {
			return false, err
		}
		if err := d.tm.Scan(pgtype.ByteaArrayOID, d.arrayFormats[1], v[14], &hvals); err != nil {
			return false, err
		}
		e.RawHeaders = rawHeaders(hkeys, hvals)
	}
	return true, nil
}

// payloadFirst is the size of a fetch's first payload buffer, which the first row
// fills; the next is sized for the rows expect says will come (or twice the last).
// A reader at its log end reads one small record per wake-up: a first buffer of 64
// KB, allocated and zeroed on every such read, was about a quarter of the CPU of the
// Kafka end-to-end bench's process (bench/RESULTS.md, session 14 (kafka16)).
const payloadFirst = 1 << 10

// expect tells d that about rows rows come in all, each with about the payload bytes
// of the first (called once, after the first row): the buffer that follows the
// first is sized for them.
func (d *fetchDecoder) expect(rows int) {
	d.want = rows * d.kept
}

// keep copies b into the fetch's payload buffer and returns the copy. Slices taken
// earlier stay valid when the buffer grows (they keep the old array).
func (d *fetchDecoder) keep(b []byte) []byte {
	if len(b) == 0 {
		return []byte{}
	}
	if cap(d.payload)-len(d.payload) < len(b) {
		d.payload = make([]byte, 0, max(payloadFirst, 2*cap(d.payload), len(b), d.want-d.kept))
	}
	d.kept += len(b)
	start := len(d.payload)
	d.payload = append(d.payload, b...)
	return d.payload[start:len(d.payload):len(d.payload)]
}

// finish sets the strings of events (the fast path's, in decoding order).
func (d *fetchDecoder) finish(events []Event) {
	if !d.fast {
		return
	}
	all := string(d.strs)
	for i := range events {
		sp := &d.spans[i]
		e := &events[i]
		e.EventID, e.EventType, e.Key = all[sp[0][0]:sp[0][1]], all[sp[1][0]:sp[1][1]], all[sp[2][0]:sp[2][1]]
		e.CorrelationID, e.CausationID = all[sp[3][0]:sp[3][1]], all[sp[4][0]:sp[4][1]]
	}
}

// scan is the row decoded by pgx (any format).
func (d *fetchDecoder) scan(rows pgx.Rows, res *FetchResult, e *Event) (bool, error) {
	var (
		off     *int64
		eventID *string
		typ     *string
		key     *string
		data    []byte
		bin     []byte
		meta    []byte
		ts      *time.Time
		corr    *string
		caus    *string
		version *int32
		hkeys   []string
		hvals   [][]byte
	)
	dest := []any{&res.LogStartOffset, &res.HighWatermark, &off, &eventID, &typ, &key, &data, &bin, &meta,
		&ts, &corr, &caus, &version, &hkeys, &hvals, &e.KeyBytes}
	for range d.extra {
		dest = append(dest, nil)
	}
	if err := rows.Scan(dest...); err != nil {
		return false, err
	}
	if off == nil {
		return false, nil // the partition exists but has no events at or after offset
	}
	e.Offset = *off
	e.EventID, e.EventType = *eventID, *typ
	if key != nil {
		e.Key = *key
	}
	if data != nil {
		e.Data = json.RawMessage(data)
	}
	e.Bytes = bin
	if meta != nil {
		e.Headers = decodeHeaders(meta)
	}
	e.Timestamp = *ts
	if corr != nil {
		e.CorrelationID = *corr
	}
	if caus != nil {
		e.CausationID = *caus
	}
	e.Version = *version
	if hkeys != nil {
		e.RawHeaders = rawHeaders(hkeys, hvals)
	}
	return true, nil
}

func rawHeaders(keys []string, vals [][]byte) []Header {
	if len(keys) != len(vals) {
		return nil
	}
	out := make([]Header, len(keys))
	for i := range keys {
		out[i] = Header{Key: keys[i], Value: vals[i]}
	}
	return out
}

func int8Value(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("bigint: %d bytes", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// jsonb is the JSON text of column col's jsonb value: as it is in the text format,
// after a version byte (1) in the binary format.
func (d *fetchDecoder) jsonb(col int, b []byte) ([]byte, error) {
	if !d.jsonbBinary[col] {
		return b, nil
	}
	if len(b) == 0 || b[0] != 1 {
		return nil, fmt.Errorf("jsonb: unknown binary format")
	}
	return b[1:], nil
}
