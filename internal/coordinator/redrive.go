package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/sqlerr"
)

// Redrive returns the leader service that runs background redrive tasks
// (streamd.redrive_tasks, created through the API): every tick it moves a slice of each
// open task's dead letters back to their origins with streamd.redrive_task_step, which
// counts them in the same transaction. A task with a rate moves rate messages a second
// (paced by credit, see redriveTick); without one, up to 1000 per tick.
func Redrive(pool *pgxpool.Pool, logger *slog.Logger, tick time.Duration) Continuous {
	if logger == nil {
		logger = slog.Default()
	}
	return Continuous{Name: "redrive", Run: func(ctx context.Context) error {
		t := time.NewTicker(tick)
		defer t.Stop()
		credit := map[taskKey]float64{} // per task: messages it may move now
		last := time.Now()
		for {
			now := time.Now()
			if err := redriveTick(ctx, pool, logger, now.Sub(last), credit); err != nil && ctx.Err() == nil {
				return err
			}
			last = now
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}}
}

type taskKey struct {
	dlq string
	id  int64
}

// redriveTick moves a slice of each open task. A task with a rate earns rate ×
// elapsed messages of credit per tick (at most a second's worth) and moves the whole
// part of it, so a low rate is kept (rate 1 moves one message a second, not one a
// tick). A step that fails for a passing reason (a lost connection, a deadlock, a
// timeout) is tried again next tick; any other failure marks the task failed.
func redriveTick(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, elapsed time.Duration, credit map[taskKey]float64) error {
	rows, err := pool.Query(ctx, `SELECT dlq, id, rate FROM streamd.redrive_tasks
		WHERE status IN ('pending', 'running') ORDER BY created_at LIMIT 100`)
	if err != nil {
		return fmt.Errorf("list redrive tasks: %w", err)
	}
	type task struct {
		dlq  string
		id   int64
		rate float64
	}
	var tasks []task
	for rows.Next() {
		var t task
		if err := rows.Scan(&t.dlq, &t.id, &t.rate); err != nil {
			rows.Close()
			return err
		}
		tasks = append(tasks, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	open := map[taskKey]bool{}
	for _, t := range tasks {
		k := taskKey{t.dlq, t.id}
		open[k] = true
		batch := 1000
		if t.rate > 0 {
			c := min(credit[k]+t.rate*elapsed.Seconds(), math.Max(t.rate, 1))
			credit[k] = c
			if c < 1 {
				continue
			}
			batch = int(min(math.Floor(c), 1e6))
			credit[k] = c - float64(batch)
		}
		var moved *int32
		if err := pool.QueryRow(ctx, "SELECT streamd.redrive_task_step($1, $2, $3)", t.dlq, t.id, batch).Scan(&moved); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if sqlerr.Retriable(err) {
				logger.Warn("redrive task step failed; trying again", "dlq", t.dlq, "task", t.id, "err", err)
				continue
			}
			logger.Warn("redrive task failed", "dlq", t.dlq, "task", t.id, "err", err)
			if _, uerr := pool.Exec(ctx, `UPDATE streamd.redrive_tasks SET status = 'failed', error = $3,
				finished_at = now(), updated_at = now() WHERE dlq = $1 AND id = $2`, t.dlq, t.id, err.Error()); uerr != nil {
				return uerr
			}
		}
	}
	for k := range credit {
		if !open[k] {
			delete(credit, k) // finished, failed or canceled
		}
	}
	return nil
}
