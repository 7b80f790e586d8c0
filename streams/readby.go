package streams

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/backoff"
	"github.com/streamd/streamd/internal/sqlerr"
)

// ReadIndex is a kind of per-stream read index (seed 003 indexes events by
// correlation id and by event type).
type ReadIndex string

const (
	// ReadIndexCorrelationID indexes a stream's events by correlation id.
	ReadIndexCorrelationID ReadIndex = "correlation_id"
	// ReadIndexEventType indexes a stream's events by event type.
	ReadIndexEventType ReadIndex = "event_type"
)

// ReadIndexInfo is a read index a stream has.
type ReadIndexInfo struct {
	Kind ReadIndex `json:"kind"`
	// Index is the PostgreSQL index's name (in schema streamd).
	Index string `json:"index"`
	// Valid is false for an index whose build failed (or is under way): EnableReadIndex
	// rebuilds it.
	Valid bool `json:"valid"`
}

// EnableReadIndex builds the read index of kind on stream, so that
// ReadByCorrelationID or ReadByEventType on it read an index range instead of every
// event of the stream. Only that stream's appends pay for it (one more index entry per
// event; bench's "append-read-index" case measures it). It is built CONCURRENTLY:
// appends go on meanwhile, and the call takes as long as a pass over the stream's
// events. Idempotent. A build that failed before (cancelled, or a deadlock victim)
// left an invalid index of that name, which CREATE INDEX ... IF NOT EXISTS would keep:
// EnableReadIndex drops it (CONCURRENTLY) and builds it again. A build that loses a
// deadlock is retried (see retryIndexDDL). Errors: ErrStreamNotFound, ErrInvalidName,
// ErrInvalidArgument (unknown kind), or the last build's error.
func (c *Client) EnableReadIndex(ctx context.Context, stream string, kind ReadIndex) error {
	return retryIndexDDL(ctx, func() error { return c.buildReadIndex(ctx, stream, kind) })
}

// retryIndexDDL runs a read index's CONCURRENTLY build or drop, again while it loses
// deadlocks, up to readIndexAttempts times with a backoff. Such a statement waits for
// every transaction that holds a lock on streamd.events while it holds the table's
// SHARE UPDATE EXCLUSIVE lock: a transaction that then wants a lock the statement
// holds or queues for (an ANALYZE of streamd.events, or an append queued behind the
// index's final ACCESS EXCLUSIVE lock that another append waits for) closes a cycle,
// and PostgreSQL ends one of them. An append that loses is retried by the append
// path; the DDL is retried here.
func retryIndexDDL(ctx context.Context, ddl func() error) error {
	b := backoff.NewJittered(50*time.Millisecond, 2*time.Second)
	for attempt := 1; ; attempt++ {
		err := ddl()
		if err == nil || sqlerr.Code(err) != "40P01" || attempt == readIndexAttempts {
			return err
		}
		if !b.Wait(ctx) {
			return fmt.Errorf("%w (after %v)", ctx.Err(), err)
		}
	}
}

// readIndexAttempts is how many times a read index's build or drop runs while it
// keeps losing deadlocks.
const readIndexAttempts = 5

// buildReadIndex makes the read index of kind on stream valid: nothing when it is,
// a drop of an invalid one (a failed CONCURRENTLY build leaves it), then the build.
// Two concurrent calls are correct: the second's drop waits for the first's build (both
// take the table's SHARE UPDATE EXCLUSIVE lock) and then builds it again.
func (c *Client) buildReadIndex(ctx context.Context, stream string, kind ReadIndex) error {
	var create, drop string
	var valid *bool
	if err := c.pool.QueryRow(ctx, `SELECT streamd.read_index_ddl($1, $2, true), streamd.read_index_ddl($1, $2, false),
		(SELECT r.valid FROM streamd.read_indexes($1) r WHERE r.kind = $2)`, stream, string(kind)).Scan(&create, &drop, &valid); err != nil {
		return fmt.Errorf("enable read index %s of %s: %w", kind, stream, sqlerr.Wrap(err))
	}
	if valid != nil && *valid {
		return nil
	}
	// The statements come from streamd.read_index_ddl (the stream name quoted as a
	// literal there); CONCURRENTLY needs them outside a transaction block.
	if valid != nil {
		if _, err := c.pool.Exec(ctx, drop); err != nil {
			return fmt.Errorf("enable read index %s of %s: drop the invalid index a failed build left: %w", kind, stream, sqlerr.Wrap(err))
		}
	}
	if _, err := c.pool.Exec(ctx, create); err != nil {
		return fmt.Errorf("enable read index %s of %s: %w", kind, stream, sqlerr.Wrap(err))
	}
	return nil
}

// DisableReadIndex drops the read index of kind on stream (valid or not); reads by it
// then scan the stream. Idempotent. A drop that loses a deadlock is retried (see
// retryIndexDDL). Errors: ErrStreamNotFound, ErrInvalidName, ErrInvalidArgument
// (unknown kind), or the last drop's error.
func (c *Client) DisableReadIndex(ctx context.Context, stream string, kind ReadIndex) error {
	return retryIndexDDL(ctx, func() error { return c.dropReadIndex(ctx, stream, kind) })
}

func (c *Client) dropReadIndex(ctx context.Context, stream string, kind ReadIndex) error {
	var ddl string
	if err := c.pool.QueryRow(ctx, "SELECT streamd.read_index_ddl($1, $2, false)", stream, string(kind)).Scan(&ddl); err != nil {
		return fmt.Errorf("disable read index %s of %s: %w", kind, stream, sqlerr.Wrap(err))
	}
	// CONCURRENTLY needs the statement outside a transaction block, so it cannot run
	// inside streamd.read_index_ddl.
	if _, err := c.pool.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("disable read index %s of %s: %w", kind, stream, sqlerr.Wrap(err))
	}
	return nil
}

// ReadIndexes returns the read indexes stream has. Errors: ErrStreamNotFound,
// ErrInvalidName.
func (c *Client) ReadIndexes(ctx context.Context, stream string) ([]ReadIndexInfo, error) {
	if _, err := c.pool.Exec(ctx, "SELECT streamd.read_index_check($1, 'event_type')", stream); err != nil {
		return nil, fmt.Errorf("read indexes of %s: %w", stream, sqlerr.Wrap(err))
	}
	rows, err := c.pool.Query(ctx, "SELECT kind, index_name, valid FROM streamd.read_indexes($1)", stream)
	if err != nil {
		return nil, fmt.Errorf("read indexes of %s: %w", stream, sqlerr.Wrap(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ReadIndexInfo, error) {
		var i ReadIndexInfo
		err := r.Scan(&i.Kind, &i.Index, &i.Valid)
		return i, err
	})
	if err != nil {
		return nil, fmt.Errorf("read indexes of %s: %w", stream, sqlerr.Wrap(err))
	}
	if out == nil {
		out = []ReadIndexInfo{}
	}
	return out, nil
}

// ReadByOpts pages a ReadByCorrelationID or ReadByEventType. A nil *ReadByOpts means
// the defaults.
type ReadByOpts struct {
	// After continues a read after this position (its Partition and Offset): pass the
	// last event of the previous page. Defaults to nil: from the start.
	After *Position
	// Limit is the most events returned, 1 to 10000. Defaults to 500.
	Limit int
}

// ReadByCorrelationID returns the retained events of stream with correlation id id,
// in (partition, offset) order, up to opts.Limit. With the stream's
// ReadIndexCorrelationID (EnableReadIndex) it reads an index range; without it, every
// event of the stream. Errors: ErrStreamNotFound, ErrInvalidName, ErrInvalidArgument.
func (c *Client) ReadByCorrelationID(ctx context.Context, stream, id string, opts *ReadByOpts) ([]Event, error) {
	return c.readBy(ctx, stream, ReadIndexCorrelationID, id, opts)
}

// ReadByEventType returns the retained events of stream of type eventType, as
// ReadByCorrelationID does (with ReadIndexEventType).
func (c *Client) ReadByEventType(ctx context.Context, stream, eventType string, opts *ReadByOpts) ([]Event, error) {
	return c.readBy(ctx, stream, ReadIndexEventType, eventType, opts)
}

func (c *Client) readBy(ctx context.Context, stream string, kind ReadIndex, value string, opts *ReadByOpts) ([]Event, error) {
	o := ReadByOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Limit == 0 {
		o.Limit = 500
	}
	if o.Limit < 1 || o.Limit > 10000 {
		return nil, invalid(ErrInvalidArgument, "read %s %q of %s: ReadByOpts.Limit %d must be between 1 and 10000", kind, value, stream, o.Limit)
	}
	afterP, afterO := int32(-1), int64(-1)
	if o.After != nil {
		afterP, afterO = o.After.Partition, o.After.Offset
	}
	rows, err := c.pool.Query(ctx, `SELECT partition, "offset", event_id, event_type, key, data, data_bytes, metadata,
		"timestamp", correlation_id, causation_id, version FROM streamd.read_events_by($1, $2, $3, $4, $5, $6)`,
		stream, string(kind), value, afterP, afterO, o.Limit)
	if err != nil {
		return nil, fmt.Errorf("read %s %q of %s: %w", kind, value, stream, sqlerr.Wrap(err))
	}
	defer rows.Close()
	out := []Event{}
	for rows.Next() {
		var (
			e          = Event{Stream: stream}
			key        *string
			data, meta []byte
			ts         time.Time
			corr, caus *string
		)
		if err := rows.Scan(&e.Partition, &e.Offset, &e.EventID, &e.EventType, &key, &data, &e.Bytes, &meta,
			&ts, &corr, &caus, &e.Version); err != nil {
			return nil, fmt.Errorf("read %s %q of %s: %w", kind, value, stream, err)
		}
		if key != nil {
			e.Key = *key
		}
		if data != nil {
			e.Data = json.RawMessage(data)
		}
		if meta != nil {
			e.Headers = decodeHeaders(meta)
		}
		e.Timestamp = ts
		if corr != nil {
			e.CorrelationID = *corr
		}
		if caus != nil {
			e.CausationID = *caus
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s %q of %s: %w", kind, value, stream, sqlerr.Wrap(err))
	}
	return out, nil
}

// dropReadIndexes drops stream's read indexes, if it has any (DeleteStream).
func (c *Client) dropReadIndexes(ctx context.Context, stream string) error {
	rows, err := c.pool.Query(ctx, "SELECT kind FROM streamd.read_indexes($1)", stream)
	if err != nil {
		return fmt.Errorf("delete stream %s: read indexes: %w", stream, sqlerr.Wrap(err))
	}
	kinds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("delete stream %s: read indexes: %w", stream, sqlerr.Wrap(err))
	}
	for _, k := range kinds {
		if err := c.DisableReadIndex(ctx, stream, ReadIndex(k)); err != nil {
			return fmt.Errorf("delete stream %s: %w", stream, err)
		}
	}
	return nil
}
