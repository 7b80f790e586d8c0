package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Redrive returns the leader service that runs background redrive tasks
// (streamd.redrive_tasks, created through the API): every tick it moves a slice of each
// open task's dead letters back to their origins with streamd.redrive_task_step, which
// counts them in the same transaction. A task with a rate moves about rate × tick per
// tick; without one, up to 1000. A task whose step fails is marked failed.
func Redrive(pool *pgxpool.Pool, logger *slog.Logger, tick time.Duration) Continuous {
	if logger == nil {
		logger = slog.Default()
	}
	return Continuous{Name: "redrive", Run: func(ctx context.Context) error {
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			if err := redriveTick(ctx, pool, logger, tick); err != nil && ctx.Err() == nil {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}}
}

func redriveTick(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, tick time.Duration) error {
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
	for _, t := range tasks {
		batch := 1000
		if t.rate > 0 {
			batch = int(math.Max(1, math.Round(t.rate*tick.Seconds())))
		}
		if _, err := pool.Exec(ctx, "SELECT streamd.redrive_task_step($1, $2, $3)", t.dlq, t.id, batch); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			logger.Warn("redrive task failed", "dlq", t.dlq, "task", t.id, "err", err)
			if _, uerr := pool.Exec(ctx, `UPDATE streamd.redrive_tasks SET status = 'failed', error = $3,
				finished_at = now(), updated_at = now() WHERE dlq = $1 AND id = $2`, t.dlq, t.id, err.Error()); uerr != nil {
				return uerr
			}
		}
	}
	return nil
}
