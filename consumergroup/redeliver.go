package consumergroup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// Redelivery of replayed dead letters to their group only (DESIGN.md, "Dead letters
// redelivered to their group only"): Admin.ReplayDeadLetter marks a dead letter
// replayed and notifies the group's channel; the partition's owner takes its replayed
// dead letters before its next fetch and hands them to the handler as a batch of their
// own (Batch.Redelivered). No offset moves and no other group sees anything.

// redeliverIfAsked hands the partition's replayed dead letters to the handler, in
// offset order and batches of at most MaxBatchSize, when a replay may have happened
// since the worker last found none (a 'redeliver' notification, a reconnect of the
// group listener, or the worker's start). It returns false when the worker must exit
// (stopped, cancelled or fenced). Called by run only, between batches.
func (w *worker) redeliverIfAsked(ctx context.Context) bool {
	gen := w.c.redeliverGen.Load()
	if gen == w.redeliverSeen {
		return true
	}
	// Mostly there are none (every worker looks when it starts): one probe of a small
	// partial index answers that, where taking them (a fenced function) cost each of
	// a starting member's new connections the compilation of the fence (issue 21).
	// Unfenced, since it only reads: a replay after it bumps redeliverGen again.
	if pending, err := redeliveriesPending(ctx, w.c.pool, w.c.cfg.Stream, w.c.cfg.Group, w.partition); err == nil && !pending {
		w.redeliverSeen = gen
		return true
	}
	for !w.stopping() {
		events, ids, err := w.m.redeliveries(ctx, w.c.pool, w.partition, w.c.cfg.MaxBatchSize)
		if err != nil {
			if errors.Is(err, ErrFenced) {
				w.lost.Store(true)
				return false
			}
			if ctx.Err() != nil {
				return false
			}
			// Looked for again before the next fetch (redeliverSeen unchanged).
			w.c.log.Warn("read redeliveries failed", "partition", w.partition, "error", err)
			return true
		}
		if len(events) == 0 {
			w.redeliverSeen = gen
			return true
		}
		if !w.processRedelivery(ctx, events, ids) {
			return false
		}
	}
	return false
}

// processRedelivery runs one batch of redeliveries as process runs a fetched batch:
// the handler with retries, then the error policy (block, or dead-letter each event
// that still fails again: its record goes back to pending), then the mark.
func (w *worker) processRedelivery(ctx context.Context, events []streams.Event, ids []int64) bool {
	b := w.newBatch(events, 0)
	b.Redelivered, b.DeadLetterIDs = true, ids
	done := ids
	err := w.attempt(ctx, b, w.c.cfg.retries())
	if err != nil {
		if ctx.Err() != nil || w.lost.Load() || w.stopping() {
			return false
		}
		if w.c.cfg.OnHandlerError == ErrorBlock {
			if !w.block(ctx, b) {
				return false
			}
		} else {
			// Only those that succeeded alone: the others are pending again, and
			// may be replayed again (by an operator) before this mark, which must
			// not take that replay for handled.
			var ok bool
			if done, ok = w.deadLetterEvents(ctx, events, 0, ids); !ok {
				return false
			}
		}
	}
	if (b.txCommitted && err == nil) || len(done) == 0 {
		return true
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := w.m.redeliveriesDone(cctx, w.c.pool, w.partition, done); err != nil {
		w.c.log.Warn("marking redeliveries done failed; partition dropped", "partition", w.partition, "error", err)
		w.lost.Store(true)
		w.c.signal()
		return false
	}
	return true
}

// redeliveries reads up to limit replayed, not yet redelivered dead letters of the
// partition for this member (fenced like a commit), in offset order.
func (m *member) redeliveries(ctx context.Context, db streams.DBTX, partition int32, limit int) ([]streams.Event, []int64, error) {
	rows, err := db.Query(ctx, `SELECT id, "offset", event_id, event_type, coalesce(key, ''), data, data_bytes, metadata,
		event_timestamp FROM streamd.redeliveries_take($1, $2, $3, $4, $5, $6)`,
		m.stream, m.group, m.consumerID, m.epoch, partition, limit)
	if err != nil {
		return nil, nil, fmt.Errorf("read redeliveries of %s/%d for group %s: %w", m.stream, partition, m.group, fenced(err, m, partition))
	}
	var events []streams.Event
	var ids []int64
	for rows.Next() {
		var id int64
		var meta []byte
		var ts *time.Time
		e := streams.Event{Stream: m.stream, Partition: partition}
		if err := rows.Scan(&id, &e.Offset, &e.EventID, &e.EventType, &e.Key, &e.Data, &e.Bytes, &meta, &ts); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("read redeliveries of %s/%d for group %s: %w", m.stream, partition, m.group, err)
		}
		if ts != nil {
			e.Timestamp = *ts
		}
		e.Headers = headersOf(meta)
		events = append(events, e)
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read redeliveries of %s/%d for group %s: %w", m.stream, partition, m.group, fenced(err, m, partition))
	}
	return events, ids, nil
}

// redeliveriesPending reports whether the partition has replayed dead letters of the
// group not yet redelivered (the partial index dead_letter_queue_redeliveries).
func redeliveriesPending(ctx context.Context, db streams.DBTX, stream, group string, partition int32) (bool, error) {
	var pending bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM streamd.dead_letter_queue d
		WHERE d.stream_name = $1 AND d.group_id = $2 AND d.partition = $3
		  AND d.status = 'replayed' AND d.redelivered_at IS NULL)`, stream, group, partition).Scan(&pending)
	if err != nil {
		return false, fmt.Errorf("look for redeliveries of %s/%d for group %s: %w", stream, partition, group, sqlerr.Wrap(err))
	}
	return pending, nil
}

// redeliveriesDone marks redeliveries handled, fenced like a commit, in db (the
// handler's transaction with CommitTx).
func (m *member) redeliveriesDone(ctx context.Context, db streams.DBTX, partition int32, ids []int64) error {
	_, err := db.Exec(ctx, "SELECT streamd.redeliveries_done($1, $2, $3, $4, $5, $6)",
		m.stream, m.group, m.consumerID, m.epoch, partition, ids)
	if err != nil {
		return fmt.Errorf("mark redeliveries %v of %s/%d for group %s: %w", ids, m.stream, partition, m.group, fenced(err, m, partition))
	}
	return nil
}

// headersOf turns a stored metadata object into headers (non-string values as their
// JSON text).
func headersOf(meta []byte) map[string]string {
	if meta == nil {
		return nil
	}
	var obj map[string]any
	if json.Unmarshal(meta, &obj) != nil || len(obj) == 0 {
		return nil
	}
	out := make(map[string]string, len(obj))
	for k, v := range obj {
		if s, ok := v.(string); ok {
			out[k] = s
		} else {
			b, _ := json.Marshal(v)
			out[k] = string(b)
		}
	}
	return out
}

// errorDetail is what a dead letter records beside the error's text: its type and
// its %+v form (a stack trace for errors that format one).
func errorDetail(err error) string {
	return fmt.Sprintf("%T: %+v", err, err)
}

// settleDeadLetter settles a pending dead letter (streamd.dead_letter_settle).
func settleDeadLetter(ctx context.Context, db streams.DBTX, stream string, id int64, status, by string) error {
	_, err := db.Exec(ctx, "SELECT streamd.dead_letter_settle($1, $2, $3, $4, NULL)", stream, id, status, by)
	if err != nil {
		return fmt.Errorf("mark dead letter %d of %s %s: %w", id, stream, status, sqlerr.Wrap(err))
	}
	return nil
}
