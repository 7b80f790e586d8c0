package streams

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/wakeup"
)

// FetchOpts bounds a Fetch. A nil *FetchOpts means the defaults.
type FetchOpts struct {
	// MaxBytes bounds the payload bytes returned (Event.Size); at least one event is
	// returned when one is available, whatever its size. Defaults to 1 MiB.
	MaxBytes int
	// MaxRecords bounds the number of events returned. Defaults to 500.
	MaxRecords int
	// MaxWait, when positive, waits up to this long for events to arrive when there
	// are none at the offset yet (long poll). Defaults to 0: return at once. When ctx
	// ends during the wait, Fetch returns ctx's error (errors.Is context.Canceled or
	// context.DeadlineExceeded) and no result.
	MaxWait time.Duration
	// PollInterval is the first interval between polls while waiting; it doubles up to
	// 100ms, or up to 1s when Wakeups is set. Defaults to 5ms.
	PollInterval time.Duration
	// Wakeups, when set, ends a wait between polls as soon as it reports a wake-up
	// for the partition (a wakeup.Listener's Hub: the tailer or a LISTEN connection saw
	// a commit). The Fetch subscribes before its first read, so a commit between a
	// poll and the wait is not missed; polling stays on as the safety net. Defaults to
	// nil: poll only.
	Wakeups *wakeup.Hub
}

// FetchResult is what a Fetch returns.
type FetchResult struct {
	// Events are in offset order, starting at the first stored offset at or after the
	// one asked for (retention and compaction may leave holes).
	Events []Event `json:"events"`
	// NextOffset is the offset to fetch next: one past the last event returned, or the
	// offset asked for when none was.
	NextOffset int64 `json:"next_offset"`
	// LogStartOffset and HighWatermark (the log end: the next offset to be assigned)
	// bound the partition's stored offsets at the time of the fetch.
	LogStartOffset int64 `json:"log_start_offset"`
	HighWatermark  int64 `json:"high_watermark"`
}

// fetchSQL reads up to $4 events from offset $3, and fewer when they are large: at
// most $5 (MaxBytes) divided by the largest stored size among the first 8 (plus one,
// so that the Go cut, exact by Event.Size, can see where MaxBytes ends). Without it, a
// fetch of large events read and sent MaxRecords of them to return one or two. The
// stored size is pg_column_size of the data (which reads no TOAST) plus the bytes and
// the key: compression makes it smaller than Event.Size, so compressible events may
// still be over-read by their compression ratio; a stream of mixed sizes gets shorter
// fetches while a large event is among the first 8. The estimate is one short index
// read; a running sum over the rows (a window) cost 15% of a 500-event fetch.
var fetchSQL = `SELECT ` + fetchColumnsSQL + `
  FROM streamd.stream_partitions h
  LEFT JOIN LATERAL (` + eventsFromSQL("", "$2", "$3", "$4::bigint", "$5::bigint") + `) e ON true
 WHERE h.stream_name = $1 AND h.partition = $2`

// fetchColumnsSQL are a fetch's columns, fetchColumnOIDs' (fetch_decode.go): the head
// row's log start and log end, then the event's.
const fetchColumnsSQL = `h.log_start_offset, h.next_offset,
       e."offset", e.event_id, e.event_type, e.key, e.data, e.data_bytes, e.metadata,
       e."timestamp", e.correlation_id, e.causation_id, e.version, e.header_keys, e.header_values, e.key_bytes`

// eventsFromSQL is the LATERAL read of head row h's events (fetchSQL's, and each
// partition's of fetchPartitionsSQL): those from offset on, in offset order, at most
// maxRecords and about maxBytes by the estimate above; guard (SQL ending in AND, or
// empty) is a condition of the read's own. One text for both statements, so that the
// read of one partition and the read of several cannot differ.
func eventsFromSQL(guard, partition, offset, maxRecords, maxBytes string) string {
	return `
        SELECT * FROM streamd.events e
         WHERE ` + guard + `e.stream_name = h.stream_name AND e.partition = h.partition AND e."offset" >= ` + offset + `
         ORDER BY e."offset"
         LIMIT least(` + maxRecords + `, ` + maxBytes + ` / greatest((
               SELECT max(coalesce(pg_column_size(f.data), 0) + coalesce(octet_length(f.data_bytes), 0)
                          + coalesce(octet_length(f.key), 0) + coalesce(octet_length(f.key_bytes), 0))
                 FROM (SELECT f.data, f.data_bytes, f.key, f.key_bytes FROM streamd.events f
                        WHERE f.stream_name = $1 AND f.partition = ` + partition + ` AND f."offset" >= ` + offset + `
                        ORDER BY f."offset" LIMIT 8) f), 1) + 1)`
}

// Fetch reads the events of one partition from offset on, in offset order. An offset
// below the log start (deleted by retention) or past the log end fails with an
// *OffsetOutOfRangeError; an offset equal to the log end returns no events (after
// waiting up to opts.MaxWait for some).
func (c *Client) Fetch(ctx context.Context, stream string, partition int32, offset int64, opts *FetchOpts) (*FetchResult, error) {
	return FetchTx(ctx, c.pool, stream, partition, offset, opts)
}

// FetchTx is Fetch on db (a pool, connection or transaction).
func FetchTx(ctx context.Context, db DBTX, stream string, partition int32, offset int64, opts *FetchOpts) (*FetchResult, error) {
	o := FetchOpts{}
	if opts != nil {
		o = *opts
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = 1 << 20
	}
	if o.MaxRecords <= 0 {
		o.MaxRecords = 500
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 5 * time.Millisecond
	}
	if partition < 0 {
		return nil, invalid(ErrPartitionNotFound, "fetch %s: partition %d is negative", stream, partition)
	}
	if offset < 0 {
		return nil, invalid(ErrInvalidArgument, "fetch %s/%d: offset %d is negative", stream, partition, offset)
	}
	if o.MaxWait <= 0 {
		return fetchOnce(ctx, db, stream, partition, offset, &o)
	}
	poll := &wakeup.PollOpts{MinInterval: o.PollInterval, MaxInterval: max(o.PollInterval, 100*time.Millisecond)}
	var sub *wakeup.Subscription
	if o.Wakeups != nil {
		sub = o.Wakeups.SubscribePartition(stream, partition)
		defer sub.Close()
		// Woken at once on a commit: polling is only the safety net.
		poll.MaxInterval = max(o.PollInterval, time.Second)
	}
	var (
		res    *FetchResult
		tryErr error
	)
	err := wakeup.Poll(ctx, sub, time.Now().Add(o.MaxWait), poll, func() (bool, error) {
		res, tryErr = fetchOnce(ctx, db, stream, partition, offset, &o)
		return tryErr == nil && len(res.Events) > 0, tryErr
	})
	switch {
	case tryErr != nil:
		return nil, tryErr
	case err != nil:
		// ctx ended during the wait. As a queue's long-poll Receive does: the caller
		// learns that the wait was cut short, not that the partition had nothing.
		return nil, fmt.Errorf("fetch %s/%d: %w", stream, partition, err)
	}
	return res, nil
}

func fetchOnce(ctx context.Context, db DBTX, stream string, partition int32, offset int64, o *FetchOpts) (*FetchResult, error) {
	// MaxBytes one below the largest bigint: the bound adds one to it.
	rows, err := db.Query(ctx, fetchSQL, stream, partition, offset, int64(o.MaxRecords), min(int64(o.MaxBytes), math.MaxInt64-1))
	if err != nil {
		return nil, fmt.Errorf("fetch %s/%d: %w", stream, partition, sqlerr.Wrap(err))
	}
	defer rows.Close()
	res := &FetchResult{NextOffset: offset}
	found := false
	size := 0
	d := newFetchDecoder(rows)
	var first Event // the first row's event, decoded before the slice is sized
	for rows.Next() {
		found = true
		// Each event is decoded in place, in the slice's next element: an Event is
		// about 250 bytes, and allocating each one, copying it in and growing the
		// slice took about a quarter of fetchOnce's CPU in a profile of the consume
		// benchmark (issue 21).
		e := &first
		if res.Events != nil {
			res.Events = append(res.Events, Event{})
			e = &res.Events[len(res.Events)-1]
		}
		n, ok, err := d.row(rows, res, e)
		if err != nil {
			return nil, fmt.Errorf("fetch %s/%d: %w", stream, partition, err)
		}
		if !ok {
			// The partition exists but has no events at or after offset (the one
			// row of the LEFT JOIN, never after an event).
			if res.Events != nil {
				res.Events = res.Events[:len(res.Events)-1]
			}
			continue
		}
		e.Stream, e.Partition = stream, partition
		if res.Events == nil {
			// Sized once for the rows that can come: at most MaxRecords, the offsets
			// up to the log end, and MaxBytes worth of events the size of the first.
			res.Events = make([]Event, 1, fetchCapacity(o, res.HighWatermark-first.Offset, n))
			d.expect(cap(res.Events))
			res.Events[0] = first
			size = n
			continue
		}
		if size+n > o.MaxBytes {
			res.Events = res.Events[:len(res.Events)-1]
			break
		}
		size += n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("fetch %s/%d: %w", stream, partition, sqlerr.Wrap(err))
	}
	rows.Close()
	d.finish(res.Events)
	if !found {
		return nil, partitionMissing(ctx, db, stream, partition)
	}
	if offset < res.LogStartOffset || offset > res.HighWatermark {
		return nil, &OffsetOutOfRangeError{Stream: stream, Partition: partition, Offset: offset,
			LogStartOffset: res.LogStartOffset, NextOffset: res.HighWatermark}
	}
	if n := len(res.Events); n > 0 {
		res.NextOffset = res.Events[n-1].Offset + 1
	}
	return res, nil
}

// fetchCapacity is the length to allocate a fetch's events for: MaxRecords, or fewer
// when the log end is closer (offsets left) or when MaxBytes holds fewer events of the
// first event's size (size); at least one. Holes and smaller events later make it too
// small, and append grows it then.
func fetchCapacity(o *FetchOpts, left int64, size int) int {
	c := int64(o.MaxRecords)
	c = min(c, max(left, 1))
	c = min(c, int64(o.MaxBytes/max(size, 1))+1)
	return int(max(c, 1))
}

// partitionMissing returns the typed error for a partition without a head row.
func partitionMissing(ctx context.Context, db DBTX, stream string, partition int32) error {
	_, err := db.Exec(ctx, "SELECT streamd.raise_partition_missing($1, $2)", stream, partition)
	if err == nil {
		err = fmt.Errorf("%w: %s/%d", ErrPartitionNotFound, stream, partition)
	}
	return fmt.Errorf("fetch %s/%d: %w", stream, partition, sqlerr.Wrap(err))
}

// decodeHeaders turns the metadata column into headers: string values as they are,
// other JSON values as their JSON text. Metadata that is not a JSON object (written by
// plain SQL) is returned under the header "metadata".
func decodeHeaders(meta []byte) map[string]string {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(meta, &obj); err != nil {
		return map[string]string{"metadata": string(meta)}
	}
	out := make(map[string]string, len(obj))
	for k, v := range obj {
		var s string
		if err := json.Unmarshal(v, &s); err == nil {
			out[k] = s
		} else {
			out[k] = string(v)
		}
	}
	return out
}

// OffsetForTime returns the first offset of a partition whose timestamp is at or
// after t, or the log end when every stored event is older (Kafka's offsetsForTimes).
func (c *Client) OffsetForTime(ctx context.Context, stream string, partition int32, t time.Time) (int64, error) {
	var off int64
	err := c.pool.QueryRow(ctx, "SELECT streamd.offset_for_time($1, $2, $3)", stream, partition, t).Scan(&off)
	if err != nil {
		return 0, fmt.Errorf("offset for time %s/%d: %w", stream, partition, sqlerr.Wrap(err))
	}
	return off, nil
}
