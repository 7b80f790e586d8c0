package messages

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/sqlerr"
)

// ErrRedriveTaskNotFound: no open redrive task has that queue and id.
var ErrRedriveTaskNotFound = errors.New("redrive task not found")

// RedriveTask is a background redrive of a dead-letter queue (a row of
// streamd.redrive_tasks): streamd serve's leader moves up to MaxMessages of the queue's
// dead letters back to their origins, Rate a second, and counts them in Moved.
type RedriveTask struct {
	DLQ         string     `json:"dlq"`
	ID          int64      `json:"id"`
	Rate        float64    `json:"rate"`
	MaxMessages int64      `json:"max_messages"`
	Moved       int64      `json:"moved"`
	Status      string     `json:"status"`
	Error       *string    `json:"error,omitempty"`
	CreatedBy   *string    `json:"created_by,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
}

// The statuses of a RedriveTask. Pending and running tasks are open.
const (
	RedriveTaskPending  = "pending"
	RedriveTaskRunning  = "running"
	RedriveTaskDone     = "done"
	RedriveTaskFailed   = "failed"
	RedriveTaskCanceled = "canceled"
)

const redriveTaskColumns = `dlq, id, rate, max_messages, moved, status, error, created_by, created_at, finished_at`

func scanRedriveTask(r pgx.Row) (RedriveTask, error) {
	var t RedriveTask
	err := r.Scan(&t.DLQ, &t.ID, &t.Rate, &t.MaxMessages, &t.Moved, &t.Status, &t.Error, &t.CreatedBy, &t.CreatedAt, &t.FinishedAt)
	return t, err
}

// RedriveTaskOpts are CreateRedriveTask's knobs. A nil *RedriveTaskOpts means the
// defaults.
type RedriveTaskOpts struct {
	// CreatedBy names who asked for the task. Defaults to "": nobody named.
	CreatedBy string
	// MaxMessages is the most messages the task moves. Defaults to 0: the dead
	// letters the queue holds now (the task records that count, so a poison message
	// that fails again and comes back cannot keep it running).
	MaxMessages int64
	// Rate bounds the messages moved per second. Defaults to 0: unbounded.
	Rate float64
}

// CreateRedriveTask records a background redrive of dlq for streamd serve's leader to
// run, and returns it. With nothing to move (MaxMessages 0 and an empty queue) the
// task is done at once. Errors: ErrInvalidName, ErrQueueNotFound, ErrInvalidArgument
// for a negative or not finite Rate or a negative MaxMessages.
func (c *Client) CreateRedriveTask(ctx context.Context, dlq string, opts *RedriveTaskOpts) (*RedriveTask, error) {
	o := RedriveTaskOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0) || o.MaxMessages < 0 {
		return nil, invalid(ErrInvalidArgument, "redrive task of %s: rate (%v) and max messages (%d) must not be negative", dlq, o.Rate, o.MaxMessages)
	}
	if _, err := c.GetQueue(ctx, dlq); err != nil {
		return nil, err
	}
	var by *string
	if o.CreatedBy != "" {
		by = &o.CreatedBy
	}
	t, err := scanRedriveTask(c.pool.QueryRow(ctx, `INSERT INTO streamd.redrive_tasks
		    (dlq, rate, max_messages, created_by, status, finished_at)
		SELECT $1, $2, n.n, $4, CASE WHEN n.n = 0 THEN 'done' ELSE 'pending' END, CASE WHEN n.n = 0 THEN now() END
		  FROM (SELECT CASE WHEN $3::bigint > 0 THEN $3::bigint
		                    ELSE coalesce((SELECT total FROM streamd.queue_stats($1, NULL)), 0) END AS n) n
		RETURNING `+redriveTaskColumns, dlq, o.Rate, o.MaxMessages, by))
	if err != nil {
		return nil, fmt.Errorf("create redrive task of %s: %w", dlq, sqlerr.Wrap(err))
	}
	return &t, nil
}

// ListRedriveTasks returns the newest 1000 redrive tasks, newest first; with status
// not "", only those in that status. Errors: ErrInvalidArgument for an unknown status.
func (c *Client) ListRedriveTasks(ctx context.Context, status string) ([]RedriveTask, error) {
	switch status {
	case "", RedriveTaskPending, RedriveTaskRunning, RedriveTaskDone, RedriveTaskFailed, RedriveTaskCanceled:
	default:
		return nil, invalid(ErrInvalidArgument, "redrive task status %q: want pending, running, done, failed or canceled", status)
	}
	rows, err := c.pool.Query(ctx, `SELECT `+redriveTaskColumns+` FROM streamd.redrive_tasks
		WHERE $1 = '' OR status = $1 ORDER BY created_at DESC LIMIT 1000`, status)
	if err != nil {
		return nil, fmt.Errorf("list redrive tasks: %w", err)
	}
	tasks, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RedriveTask, error) { return scanRedriveTask(row) })
	if err != nil {
		return nil, fmt.Errorf("list redrive tasks: %w", err)
	}
	return tasks, nil
}

// CancelRedriveTask cancels open task id of dlq and returns it; the moves it made
// stay. ErrRedriveTaskNotFound when there is no such open task.
func (c *Client) CancelRedriveTask(ctx context.Context, dlq string, id int64) (*RedriveTask, error) {
	t, err := scanRedriveTask(c.pool.QueryRow(ctx, `UPDATE streamd.redrive_tasks
		SET status = 'canceled', finished_at = now(), updated_at = now()
		WHERE dlq = $1 AND id = $2 AND status IN ('pending', 'running') RETURNING `+redriveTaskColumns, dlq, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("cancel redrive task %d of queue %s: %w: none open", id, dlq, ErrRedriveTaskNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("cancel redrive task %d of queue %s: %w", id, dlq, sqlerr.Wrap(err))
	}
	return &t, nil
}

// OpenRedriveTasks returns up to limit open (pending or running) redrive tasks, oldest
// first: what the leader's redrive service works through.
func (c *Client) OpenRedriveTasks(ctx context.Context, limit int) ([]RedriveTask, error) {
	rows, err := c.pool.Query(ctx, `SELECT `+redriveTaskColumns+` FROM streamd.redrive_tasks
		WHERE status IN ('pending', 'running') ORDER BY created_at LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list open redrive tasks: %w", err)
	}
	tasks, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RedriveTask, error) { return scanRedriveTask(row) })
	if err != nil {
		return nil, fmt.Errorf("list open redrive tasks: %w", err)
	}
	return tasks, nil
}

// StepRedriveTask moves up to batch dead letters of task id of dlq back to their
// origins and counts them in the task, in one transaction; it finishes the task when
// the queue ran dry or MaxMessages was reached. It returns how many moved, and false
// when the task is no longer open.
func (c *Client) StepRedriveTask(ctx context.Context, dlq string, id int64, batch int) (int, bool, error) {
	var moved *int32
	if err := c.pool.QueryRow(ctx, "SELECT streamd.redrive_task_step($1, $2, $3)", dlq, id, batch).Scan(&moved); err != nil {
		return 0, false, fmt.Errorf("redrive task %d of queue %s: %w", id, dlq, sqlerr.Wrap(err))
	}
	if moved == nil {
		return 0, false, nil
	}
	return int(*moved), true, nil
}

// FailRedriveTask marks task id of dlq failed with message msg.
func (c *Client) FailRedriveTask(ctx context.Context, dlq string, id int64, msg string) error {
	if _, err := c.pool.Exec(ctx, `UPDATE streamd.redrive_tasks SET status = 'failed', error = $3,
		finished_at = now(), updated_at = now() WHERE dlq = $1 AND id = $2`, dlq, id, msg); err != nil {
		return fmt.Errorf("fail redrive task %d of queue %s: %w", id, dlq, err)
	}
	return nil
}
