package messages

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/sqlerr"
)

// DeadLetter is the record of a message that moved to a dead-letter queue: the same
// vocabulary as a consumer group's dead letters (consumergroup.DeadLetter). Status is
// pending (waiting in the dead-letter queue), replayed (moved back to its origin
// queue), discarded (deleted), or resolved (dealt with by hand, without replay; a
// pending record whose message left the dead-letter queue another way, a consumer of
// that queue acking it or a purge, reads as resolved by nobody). There is one per
// (dead-letter queue, message id): the message failing again after a replay adds to
// Attempts and makes it pending again.
type DeadLetter struct {
	DeadLetterQueue string `json:"dead_letter_queue"`
	MessageID       string `json:"message_id"`
	// Offset is the message's offset in the dead-letter queue; nil when it is no
	// longer there.
	Offset         *int64     `json:"offset,omitempty"`
	OriginQueue    string     `json:"origin_queue"`
	OriginOffset   *int64     `json:"origin_offset,omitempty"`
	Status         string     `json:"status"`
	Error          string     `json:"error,omitempty"`
	ErrorDetail    string     `json:"error_detail,omitempty"`
	Attempts       int        `json:"attempts"`
	FirstFailureAt time.Time  `json:"first_failure_at"`
	LastFailureAt  time.Time  `json:"last_failure_at"`
	ResolvedAt     *time.Time `json:"resolved_at,omitempty"`
	ResolvedBy     string     `json:"resolved_by,omitempty"`
}

// DeadLetters lists the dead letters of dead-letter queue dlq with status ("" for all:
// pending, replayed, discarded, resolved), oldest failure first. ErrQueueNotFound,
// ErrInvalidArgument for another status.
func (c *Client) DeadLetters(ctx context.Context, dlq, status string) ([]DeadLetter, error) {
	if err := checkName(dlq); err != nil {
		return nil, err
	}
	switch status {
	case "", "pending", "replayed", "discarded", "resolved":
	default:
		return nil, invalid(ErrInvalidArgument, "dead letters of %s: status %q: want pending, replayed, discarded or resolved", dlq, status)
	}
	if _, err := c.GetQueue(ctx, dlq); err != nil {
		return nil, err
	}
	rows, err := c.pool.Query(ctx, `SELECT dead_letter_queue, message_id, "offset", origin_queue, origin_offset, status,
		coalesce(error, ''), coalesce(error_detail, ''), attempts, first_failure_at, last_failure_at, resolved_at,
		coalesce(resolved_by, '') FROM streamd.queue_dead_letters_list($1, nullif($2, ''))`, dlq, status)
	if err != nil {
		return nil, fmt.Errorf("dead letters of %s: %w", dlq, sqlerr.Wrap(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.DeadLetterQueue, &d.MessageID, &d.Offset, &d.OriginQueue, &d.OriginOffset, &d.Status, &d.Error,
			&d.ErrorDetail, &d.Attempts, &d.FirstFailureAt, &d.LastFailureAt, &d.ResolvedAt, &d.ResolvedBy)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("dead letters of %s: %w", dlq, sqlerr.Wrap(err))
	}
	return out, nil
}

// ReplayDeadLetters moves the pending dead letters ids (message ids) of dlq back to
// the queues they came from, as Redrive does (fresh attempts, the origin's settings),
// and marks them replayed by by. It returns the ids replayed: one in flight (someone
// is receiving from dlq), whose origin queue is gone, no longer in dlq, or not pending
// is left as it is.
func (c *Client) ReplayDeadLetters(ctx context.Context, dlq, by string, ids ...string) ([]string, error) {
	return c.settleDeadLetters(ctx, dlq, "replayed", by, ids)
}

// DiscardDeadLetters deletes the pending dead letters ids of dlq and marks them
// discarded by by; ResolveDeadLetters does the same marking them resolved (dealt with
// by hand). They return the ids settled: one in flight or not pending is left as it
// is; one whose message already left dlq is marked only.
func (c *Client) DiscardDeadLetters(ctx context.Context, dlq, by string, ids ...string) ([]string, error) {
	return c.settleDeadLetters(ctx, dlq, "discarded", by, ids)
}

// ResolveDeadLetters: see DiscardDeadLetters.
func (c *Client) ResolveDeadLetters(ctx context.Context, dlq, by string, ids ...string) ([]string, error) {
	return c.settleDeadLetters(ctx, dlq, "resolved", by, ids)
}

func (c *Client) settleDeadLetters(ctx context.Context, dlq, status, by string, ids []string) ([]string, error) {
	if err := checkName(dlq); err != nil {
		return nil, err
	}
	rows, err := c.pool.Query(ctx, "SELECT id FROM streamd.queue_dead_letters_settle($1, $2, $3, $4, $5) id",
		dlq, ids, status, by, c.sqlNow())
	if err != nil {
		return nil, fmt.Errorf("mark dead letters of %s %s: %w", dlq, status, sqlerr.Wrap(err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("mark dead letters of %s %s: %w", dlq, status, sqlerr.Wrap(err))
	}
	return out, nil
}
