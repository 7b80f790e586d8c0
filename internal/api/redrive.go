package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// RedriveTask is a background redrive of a dead-letter queue, run by the leader.
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

const redriveColumns = `dlq, id, rate, max_messages, moved, status, error, created_by, created_at, finished_at`

func scanRedriveTask(r pgx.Row) (RedriveTask, error) {
	var t RedriveTask
	err := r.Scan(&t.DLQ, &t.ID, &t.Rate, &t.MaxMessages, &t.Moved, &t.Status, &t.Error, &t.CreatedBy, &t.CreatedAt, &t.FinishedAt)
	return t, err
}

func (s *Server) redriveRoutes() {
	s.Handle("POST /v1/queues/{queue}/redrive-tasks", s.adminOnly(s.createRedriveTask))
	s.Handle("GET /v1/redrive-tasks", s.adminOnly(s.listRedriveTasks))
	s.Handle("DELETE /v1/queues/{queue}/redrive-tasks/{id}", s.adminOnly(s.cancelRedriveTask))
}

type redriveTaskRequest struct {
	MaxMessages int64   `json:"max_messages"`
	Rate        float64 `json:"rate"`
}

// createRedriveTask queues a background redrive of a dead-letter queue: the leader
// moves up to max_messages back to their origins at rate messages per second (0:
// unbounded). max_messages 0 means the dead letters the queue holds now: the task
// records that count, so a poison message that fails again and comes back cannot
// keep it running. With none there, the task is done at once (a recorded 0 would read
// as "no bound" to the step).
func (s *Server) createRedriveTask(r *Request) (any, error) {
	var req redriveTaskRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	if req.Rate < 0 || req.MaxMessages < 0 {
		return nil, fmt.Errorf("%w: rate and max_messages must not be negative", ErrBadRequest)
	}
	dlq := r.PathValue("queue")
	if _, err := s.queues.GetQueue(r.Context(), dlq); err != nil {
		return nil, err
	}
	t, err := scanRedriveTask(s.pool.QueryRow(r.Context(), `INSERT INTO streamd.redrive_tasks
		    (dlq, rate, max_messages, created_by, status, finished_at)
		SELECT $1, $2, n.n, $4, CASE WHEN n.n = 0 THEN 'done' ELSE 'pending' END, CASE WHEN n.n = 0 THEN now() END
		  FROM (SELECT CASE WHEN $3::bigint > 0 THEN $3::bigint
		                    ELSE coalesce((SELECT total FROM streamd.queue_stats($1, NULL)), 0) END AS n) n
		RETURNING `+redriveColumns, dlq, req.Rate, req.MaxMessages, r.Principal))
	if err != nil {
		return nil, err
	}
	return &Status{Code: http.StatusAccepted, Value: t}, nil
}

func (s *Server) listRedriveTasks(r *Request) (any, error) {
	rows, err := s.pool.Query(r.Context(), `SELECT `+redriveColumns+` FROM streamd.redrive_tasks
		WHERE $1 = '' OR status = $1 ORDER BY created_at DESC LIMIT 1000`, r.URL.Query().Get("status"))
	if err != nil {
		return nil, err
	}
	tasks, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RedriveTask, error) { return scanRedriveTask(row) })
	if err != nil {
		return nil, err
	}
	if tasks == nil {
		tasks = []RedriveTask{}
	}
	return map[string]any{"tasks": tasks}, nil
}

func (s *Server) cancelRedriveTask(r *Request) (any, error) {
	id, err := intParam(r, "id", r.PathValue("id"), 0)
	if err != nil {
		return nil, err
	}
	t, err := scanRedriveTask(s.pool.QueryRow(r.Context(), `UPDATE streamd.redrive_tasks
		SET status = 'canceled', finished_at = now(), updated_at = now()
		WHERE dlq = $1 AND id = $2 AND status IN ('pending', 'running') RETURNING `+redriveColumns, r.PathValue("queue"), id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: no open redrive task %d of queue %s", ErrNotFound, id, r.PathValue("queue"))
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}
