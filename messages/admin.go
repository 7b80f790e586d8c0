package messages

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/sqlerr"
)

// QueueStats is a queue's state at one moment.
type QueueStats struct {
	Queue           string `json:"queue"`
	FIFO            bool   `json:"fifo"`
	DeadLetterQueue string `json:"dead_letter_queue,omitempty"`
	// Depth counts messages visible now (ready to deliver).
	Depth int64 `json:"depth"`
	// InFlight counts received messages whose lease has not ended.
	InFlight int64 `json:"in_flight"`
	// Delayed counts messages waiting for a send delay or a nack delay.
	Delayed int64 `json:"delayed"`
	// Total counts all the queue's messages.
	Total int64 `json:"total"`
	// DeadLettered counts messages from this queue now in a dead-letter queue.
	DeadLettered int64 `json:"dead_lettered"`
	// OldestAge is the age of the queue's oldest message (0 when empty).
	OldestAge time.Duration `json:"oldest_age"`
}

// Stats returns the statistics of queue, or of every queue when queue is "".
// Errors: ErrInvalidName, ErrQueueNotFound when a named queue does not exist.
func (c *Client) Stats(ctx context.Context, queue string) ([]QueueStats, error) {
	var q *string
	if queue != "" {
		if err := checkName(queue); err != nil {
			return nil, err
		}
		q = &queue
	}
	rows, err := c.pool.Query(ctx, `SELECT queue_name, fifo, coalesce(dead_letter_queue, ''), depth, in_flight, delayed,
			total, dead_lettered, extract(epoch FROM coalesce($2, statement_timestamp()) - oldest_enqueued_at)
		FROM streamd.queue_stats($1, $2)`, q, c.sqlNow())
	if err != nil {
		return nil, fmt.Errorf("queue stats: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueStats, error) {
		var s QueueStats
		var age *float64
		err := r.Scan(&s.Queue, &s.FIFO, &s.DeadLetterQueue, &s.Depth, &s.InFlight, &s.Delayed, &s.Total, &s.DeadLettered, &age)
		if age != nil && *age > 0 {
			s.OldestAge = time.Duration(*age * float64(time.Second))
		}
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("queue stats: %w", err)
	}
	if queue != "" && len(out) == 0 {
		return nil, fmt.Errorf("queue stats %q: %w", queue, ErrQueueNotFound)
	}
	return out, nil
}

// Purge deletes every message of queue, in flight or not, and returns how many.
// Receipts of purged messages become stale.
func (c *Client) Purge(ctx context.Context, queue string) (int64, error) {
	if err := checkName(queue); err != nil {
		return 0, err
	}
	var n int64
	if err := c.pool.QueryRow(ctx, "SELECT streamd.queue_purge($1)", queue).Scan(&n); err != nil {
		return 0, fmt.Errorf("purge queue %s: %w", queue, sqlerr.Wrap(err))
	}
	return n, nil
}

// PeekOpts are Peek's per-call knobs. A nil *PeekOpts means the defaults.
type PeekOpts struct {
	// AfterOffset lists messages with a higher offset. Defaults to 0: from the start.
	AfterOffset int64
	// Limit is the most messages to list. Defaults to 100.
	Limit int
}

// Peek lists messages of queue in offset order without receiving them (their
// Receipts are zero): for inspecting dead-letter queues.
func (c *Client) Peek(ctx context.Context, queue string, opts *PeekOpts) ([]*Message, error) {
	o := PeekOpts{}
	if opts != nil {
		o = *opts
	}
	if err := checkName(queue); err != nil {
		return nil, err
	}
	if o.Limit < 0 || o.AfterOffset < 0 {
		return nil, invalid(ErrInvalidArgument, "peek queue %s: PeekOpts.Limit and AfterOffset must not be negative", queue)
	}
	if o.Limit == 0 {
		o.Limit = 100
	}
	if _, err := c.GetQueue(ctx, queue); err != nil {
		return nil, err
	}
	rows, err := c.pool.Query(ctx, `SELECT "offset", message_id, data, metadata, enqueued_at, visibility_timeout,
			delivery_attempts, max_delivery_attempts, lease_token, group_key, last_error,
			origin_stream, origin_offset, origin_attempts, dead_lettered_at, data_bytes
		FROM streamd.messages WHERE stream_name = $1 AND "offset" > $2 ORDER BY "offset" LIMIT $3`, queue, o.AfterOffset, o.Limit)
	if err != nil {
		return nil, fmt.Errorf("peek queue %s: %w", queue, err)
	}
	defer rows.Close()
	var out []*Message
	for rows.Next() {
		m, err := scanMessage(rows, queue, false)
		if err != nil {
			return nil, fmt.Errorf("peek queue %s: %w", queue, err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("peek queue %s: %w", queue, err)
	}
	return out, nil
}

// Discard deletes the given messages of queue that are not in flight (e.g. dead
// letters nobody will replay) and returns the offsets deleted.
func (c *Client) Discard(ctx context.Context, queue string, offsets ...int64) ([]int64, error) {
	if err := checkName(queue); err != nil {
		return nil, err
	}
	rows, err := c.pool.Query(ctx, "SELECT o FROM streamd.queue_discard($1, $2, $3) o", queue, offsets, c.sqlNow())
	if err != nil {
		return nil, fmt.Errorf("discard from queue %s: %w", queue, sqlerr.Wrap(err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("discard from queue %s: %w", queue, sqlerr.Wrap(err))
	}
	return out, nil
}

// RedriveOpts are Redrive's per-call knobs. A nil *RedriveOpts means the defaults.
type RedriveOpts struct {
	// BatchSize is how many messages move per transaction. Defaults to 100.
	BatchSize int
	// Limit is the most messages to move. Defaults to 0: the dead letters the queue
	// holds when Redrive starts (a message that fails again and comes back meanwhile
	// waits for the next redrive, so a poison message cannot keep Redrive going).
	Limit int
	// Progress, when set, is called after each batch with the messages moved so far
	// and the most Redrive will move, in Redrive's goroutine. Defaults to nil.
	Progress func(moved, limit int)
	// Rate bounds the messages moved per second. Defaults to 0: unbounded.
	Rate float64
}

// Redrive moves dead letters of dlq back to the queues they came from, in
// dead-letter order, a batch per transaction, at most opts.Rate per second. Each gets
// fresh delivery attempts and its origin's settings; dead letters in flight (someone
// is receiving from dlq) or whose origin queue is gone stay. It returns how many
// moved; on ctx's end, the count so far and ctx's error.
func (c *Client) Redrive(ctx context.Context, dlq string, opts *RedriveOpts) (int, error) {
	o := RedriveOpts{}
	if opts != nil {
		o = *opts
	}
	if err := checkName(dlq); err != nil {
		return 0, err
	}
	if o.BatchSize < 0 || o.Limit < 0 || o.Rate < 0 {
		return 0, invalid(ErrInvalidArgument, "redrive %s: RedriveOpts.BatchSize, Limit and Rate must not be negative", dlq)
	}
	if o.BatchSize == 0 {
		o.BatchSize = 100
	}
	if o.Rate > 0 && float64(o.BatchSize) > o.Rate {
		o.BatchSize = max(1, int(o.Rate)) // at most a second's worth per batch
	}
	if o.Limit == 0 {
		// queue_stats reads the queue through its index (a plain count here would be
		// planned as a scan of the whole table: see migration 0008).
		err := c.pool.QueryRow(ctx, `SELECT total FROM streamd.queue_stats($1, NULL)`, dlq).Scan(&o.Limit)
		if errors.Is(err, pgx.ErrNoRows) {
			_, err = c.GetQueue(ctx, dlq) // ErrQueueNotFound, or ErrInvalidName
			return 0, err
		}
		if err != nil {
			return 0, fmt.Errorf("redrive %s: %w", dlq, sqlerr.Wrap(err))
		}
		if o.Limit == 0 {
			return 0, nil
		}
	}
	moved := 0
	start := time.Now()
	for moved < o.Limit {
		batch := min(o.BatchSize, o.Limit-moved)
		var n int
		if err := c.pool.QueryRow(ctx, "SELECT streamd.queue_redrive($1, $2, $3)", dlq, batch, c.sqlNow()).Scan(&n); err != nil {
			return moved, fmt.Errorf("redrive %s: %w", dlq, sqlerr.Wrap(err))
		}
		moved += n
		if o.Progress != nil {
			o.Progress(moved, o.Limit)
		}
		if n < batch {
			break
		}
		if o.Rate > 0 {
			// Pace: the moved count may not run ahead of rate * elapsed time.
			wait := time.Duration(float64(moved)/o.Rate*float64(time.Second)) - time.Since(start)
			if wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return moved, ctx.Err()
				case <-t.C:
				}
			}
		}
	}
	return moved, nil
}
