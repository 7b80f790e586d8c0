package streams

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/sqlerr"
)

// copyThreshold is the smallest batch appended with COPY by callers that choose it
// themselves (AppendPartition); Produce and the Producer take COPY above insertMax
// (insert.go).
var copyThreshold = 32

// copyAppends counts batches appended with COPY (tests check the path was taken).
var copyAppends atomic.Int64

var copyColumns = []string{"stream_name", "partition", "offset", "event_id", "event_type", "key", "data", "data_bytes",
	"metadata", "timestamp", "correlation_id", "causation_id", "version"}

// appendCopy appends records, all to stream and partition and all with an event id, in
// a transaction of its own: offsets reserved by streamd.append_reserve, rows written
// with COPY (bench/RESULTS.md measured it at about the speed of a raw COPY, against
// 0.5-0.75 for streamd.append). It reports ok=false, having written nothing, when the
// batch must take streamd.append() instead: a stream with per-key versions or enforced
// types, a payload over the limit, a duplicate event id (COPY has no ON CONFLICT), or
// a role under row-level security (COPY refuses RLS tables).
func appendCopy(ctx context.Context, pool *pgxpool.Pool, stream string, partition int32, recs []Record) (pos []Position, ok bool, err error) {
	maxPayload := 0
	for i := range recs {
		maxPayload = max(maxPayload, len(recs[i].Data)+len(recs[i].Bytes))
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("append to %s: %w", stream, err)
	}
	defer func() {
		if !ok || err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	var base int64
	var ts time.Time
	err = tx.QueryRow(ctx, "SELECT base, ts FROM streamd.append_reserve($1, $2, $3, $4)",
		stream, partition, len(recs), maxPayload).Scan(&base, &ts)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("append to %s: %w", stream, sqlerr.Wrap(err))
	}
	rows := make([][]any, len(recs))
	for i := range recs {
		r := &recs[i]
		var meta []byte
		if len(r.Headers) > 0 {
			if meta, err = json.Marshal(r.Headers); err != nil {
				return nil, false, fmt.Errorf("append to %s: encode headers: %w", stream, err)
			}
		}
		version := r.Version
		if version == 0 {
			version = 1
		}
		var data any
		if r.Data != nil {
			data = []byte(r.Data)
		}
		rows[i] = []any{stream, partition, base + int64(i), r.EventID, r.EventType, nullable(r.Key), data, r.Bytes,
			meta, ts, nullable(r.CorrelationID), nullable(r.CausationID), version}
	}
	if _, err = tx.CopyFrom(ctx, pgx.Identifier{"streamd", "events"}, copyColumns, pgx.CopyFromRows(rows)); err != nil {
		switch sqlerr.Code(err) {
		case "23505", "0A000": // a duplicate event id; a role under row-level security
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("append to %s: %w", stream, sqlerr.Wrap(err))
	}
	if err = tx.Commit(ctx); err != nil {
		return nil, false, fmt.Errorf("append to %s: commit: %w", stream, err)
	}
	copyAppends.Add(1)
	pos = make([]Position, len(recs))
	for i := range pos {
		pos[i] = Position{Partition: partition, Offset: base + int64(i), Timestamp: ts}
	}
	return pos, true, nil
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// appendOwnTx appends records of one stream in a transaction of its own: a batch of
// one partition whose records all have an event id in one statement (insertSQL) up to
// insertMax records, with COPY above; anything else, and what those paths decline,
// through streamd.append().
func appendOwnTx(ctx context.Context, pool *pgxpool.Pool, stream string, recs []Record) ([]Position, error) {
	if partition, ok := onePartitionWithIDs(recs); ok {
		var pos []Position
		var done bool
		var err error
		if len(recs) <= insertMax {
			pos, done, err = appendInsert(ctx, pool, stream, partition, recs)
		} else {
			pos, done, err = appendCopy(ctx, pool, stream, partition, recs)
		}
		if err != nil || done {
			return pos, err
		}
	}
	return appendBatch(ctx, pool, stream, recs)
}

// onePartitionWithIDs reports whether recs can take the one-statement or the COPY
// path, and their partition: one explicit partition, every event id set.
func onePartitionWithIDs(recs []Record) (int32, bool) {
	if len(recs) == 0 || recs[0].Partition == nil {
		return 0, false
	}
	p := *recs[0].Partition
	for i := range recs {
		if recs[i].Partition == nil || *recs[i].Partition != p || recs[i].EventID == "" {
			return 0, false
		}
	}
	return p, true
}
