package streams

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/streamd/streamd/internal/sqlerr"
)

// PartitionRead is one partition of a FetchPartitionsTx: where to read it from and
// how much, or only its head row.
type PartitionRead struct {
	Partition int32
	// Offset is the first offset to read (ignored with HeadOnly).
	Offset int64
	// MaxBytes and MaxRecords bound the partition's events as FetchOpts does.
	// Default to 1 MiB and 500.
	MaxBytes   int
	MaxRecords int
	// HeadOnly reads the partition's head row without its events: the result has its
	// log start offset and high watermark, no events, and no offset check.
	HeadOnly bool
}

// PartitionFetch is one partition's answer to a FetchPartitionsTx: Result, or Err
// (an *OffsetOutOfRangeError, or ErrPartitionNotFound / ErrStreamNotFound wrapped)
// when Fetch of that partition would have failed.
type PartitionFetch struct {
	Partition int32
	Result    *FetchResult
	Err       error
}

// fetchPartitionsSQL is fetchSQL over several partitions of one stream in one
// statement (one snapshot): $2..$5 are the partitions, their offsets, MaxRecords and
// MaxBytes (MaxRecords 0: the head row only), the last column is the partition's
// place in them (1-based). Each partition's events are fetchSQL's, read through the
// same index in offset order; the partitions' rows come one partition after the
// other in practice (a nested loop over the arrays), and the decoding does not rely
// on it.
var fetchPartitionsSQL = `SELECT ` + fetchColumnsSQL + `,
       q.i
  FROM unnest($2::int[], $3::bigint[], $4::bigint[], $5::bigint[]) WITH ORDINALITY AS q(partition, off, max_records, max_bytes, i)
  JOIN streamd.stream_partitions h ON h.stream_name = $1 AND h.partition = q.partition
  LEFT JOIN LATERAL (` + eventsFromSQL("q.max_records > 0 AND ", "q.partition", "q.off", "q.max_records", "q.max_bytes") + `) e ON true`

// FetchPartitionsTx reads several partitions of stream in one statement on db (a
// pool, connection or transaction): each partition's events from its offset, as
// FetchTx reads them (the same bounds, order and checks; no wait), with its log start
// offset and high watermark from the same snapshot, or only its head row
// (PartitionRead.HeadOnly). It returns one PartitionFetch per read, in the order
// given: what a reader of several partitions (the Kafka fetch) needs in one round
// trip instead of a head-row read and then a read of each partition with something
// new. A partition named twice is read twice. Each partition's bad input (a
// negative partition or offset: ErrPartitionNotFound / ErrInvalidArgument), a
// partition or stream that does not exist, or an offset out of range, is that
// partition's Err; the others are read. On a transaction, a partition or stream that
// does not exist aborts it, as it does FetchTx's.
func FetchPartitionsTx(ctx context.Context, db DBTX, stream string, reads []PartitionRead) ([]PartitionFetch, error) {
	if len(reads) == 0 {
		return nil, nil
	}
	out := make([]PartitionFetch, len(reads))
	var idx []int // the reads the statement takes, by their place in reads
	var parts []int32
	var offs, maxRecs, maxBytes []int64
	opts := make([]FetchOpts, len(reads))
	for i, r := range reads {
		out[i].Partition = r.Partition
		if r.Partition < 0 {
			out[i].Err = invalid(ErrPartitionNotFound, "fetch %s: partition %d is negative", stream, r.Partition)
			continue
		}
		if r.Offset < 0 && !r.HeadOnly {
			out[i].Err = invalid(ErrInvalidArgument, "fetch %s/%d: offset %d is negative", stream, r.Partition, r.Offset)
			continue
		}
		o := FetchOpts{MaxBytes: r.MaxBytes, MaxRecords: r.MaxRecords}
		if o.MaxBytes <= 0 {
			o.MaxBytes = 1 << 20
		}
		if o.MaxRecords <= 0 {
			o.MaxRecords = 500
		}
		opts[i] = o
		idx = append(idx, i)
		parts, offs = append(parts, r.Partition), append(offs, max(r.Offset, 0))
		// MaxBytes one below the largest bigint: the bound adds one to it.
		mr := int64(o.MaxRecords)
		if r.HeadOnly {
			mr = 0
		}
		maxRecs, maxBytes = append(maxRecs, mr), append(maxBytes, min(int64(o.MaxBytes), math.MaxInt64-1))
	}
	if len(idx) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, fetchPartitionsSQL, stream, parts, offs, maxRecs, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", stream, sqlerr.Wrap(err))
	}
	defer rows.Close()
	type partial struct {
		res   FetchResult
		found bool
		d     *fetchDecoder
		sizes []int
	}
	ps := make([]partial, len(reads))
	for rows.Next() {
		i, err := readIndex(rows)
		if err != nil {
			return nil, fmt.Errorf("fetch %s: %w", stream, err)
		}
		if i < 1 || int(i) > len(idx) {
			return nil, fmt.Errorf("fetch %s: row of read %d of %d", stream, i, len(idx))
		}
		i = int64(idx[i-1]) + 1
		p := &ps[i-1]
		p.found = true
		if p.d == nil {
			p.d = newFetchDecoder(rows)
		}
		p.res.Events = append(p.res.Events, Event{})
		e := &p.res.Events[len(p.res.Events)-1]
		n, ok, err := p.d.row(rows, &p.res, e)
		if err != nil {
			return nil, fmt.Errorf("fetch %s/%d: %w", stream, reads[i-1].Partition, err)
		}
		if !ok {
			p.res.Events = p.res.Events[:len(p.res.Events)-1]
			continue
		}
		e.Stream, e.Partition = stream, reads[i-1].Partition
		if len(p.sizes) == 0 {
			p.d.expect(fetchCapacity(&opts[i-1], p.res.HighWatermark-e.Offset, n))
		}
		p.sizes = append(p.sizes, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("fetch %s: %w", stream, sqlerr.Wrap(err))
	}
	rows.Close()
	var missing error // the first missing partition's error
	for _, i := range idx {
		r, p := reads[i], &ps[i]
		if !p.found {
			// One statement asks the database why (its error aborts a transaction, so
			// it is asked once): the stream is missing, then for every partition, or
			// the partition, and another missing partition of a stream that exists is
			// missing too.
			switch {
			case missing == nil:
				missing = partitionMissing(ctx, db, stream, r.Partition)
				out[i].Err = missing
			case errors.Is(missing, ErrStreamNotFound):
				out[i].Err = missing
			default:
				out[i].Err = fmt.Errorf("fetch %s/%d: %w: partition %d of %s", stream, r.Partition, ErrPartitionNotFound, r.Partition, stream)
			}
			continue
		}
		res := &p.res
		if p.d != nil {
			p.d.finish(res.Events)
		}
		res.NextOffset = r.Offset
		if r.HeadOnly {
			res.NextOffset, res.Events = 0, nil
			out[i].Result = res
			continue
		}
		if r.Offset < res.LogStartOffset || r.Offset > res.HighWatermark {
			out[i].Err = &OffsetOutOfRangeError{Stream: stream, Partition: r.Partition, Offset: r.Offset,
				LogStartOffset: res.LogStartOffset, NextOffset: res.HighWatermark}
			continue
		}
		cutToBytes(res, p.sizes, opts[i].MaxBytes)
		if n := len(res.Events); n > 0 {
			res.NextOffset = res.Events[n-1].Offset + 1
		}
		out[i].Result = res
	}
	return out, nil
}

// readIndex returns the current row's last column of fetchPartitionsSQL (the read's
// place, 1-based).
func readIndex(rows pgx.Rows) (int64, error) {
	raw, fds := rows.RawValues(), rows.FieldDescriptions()
	last := len(fetchColumnOIDs)
	if len(raw) != last+1 || len(fds) != last+1 {
		return 0, fmt.Errorf("%d columns", len(raw))
	}
	if fds[last].DataTypeOID == pgtype.Int8OID && fds[last].Format == pgtype.BinaryFormatCode {
		return int8Value(raw[last])
	}
	var i int64
	err := rows.Conn().TypeMap().Scan(fds[last].DataTypeOID, fds[last].Format, raw[last], &i)
	return i, err
}

// cutToBytes puts res.Events in offset order (the order the statement returns them
// in already, in practice) and keeps those within maxBytes (sizes are their
// Event.Size, in the order given), the first whatever its size, as fetchOnce cuts.
func cutToBytes(res *FetchResult, sizes []int, maxBytes int) {
	if !slices.IsSortedFunc(res.Events, func(a, b Event) int { return cmp.Compare(a.Offset, b.Offset) }) {
		idx := make([]int, len(res.Events))
		for i := range idx {
			idx[i] = i
		}
		slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(res.Events[a].Offset, res.Events[b].Offset) })
		evs, sz := make([]Event, len(idx)), make([]int, len(idx))
		for to, from := range idx {
			evs[to], sz[to] = res.Events[from], sizes[from]
		}
		res.Events, sizes = evs, sz
	}
	size := 0
	for i, n := range sizes {
		if i > 0 && size+n > maxBytes {
			res.Events = res.Events[:i]
			return
		}
		size += n
	}
}
