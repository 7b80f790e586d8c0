package coordinator

import (
	"context"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/messages"
)

// Redrive returns the leader service that runs background redrive tasks
// (messages.Client.CreateRedriveTask, through the API): every tick it moves a slice of
// each open task's dead letters back to their origins with
// messages.Client.StepRedriveTask, which counts them in the same transaction. A task with a rate moves rate messages a second
// (paced by credit, see redriveTick); without one, up to 1000 per tick.
func Redrive(pool *pgxpool.Pool, logger *slog.Logger, tick time.Duration) Continuous {
	if logger == nil {
		logger = slog.Default()
	}
	queues, qerr := messages.NewClient(pool, &messages.ClientConfig{Logger: logger})
	return Continuous{Name: "redrive", Run: func(ctx context.Context) error {
		if qerr != nil {
			return qerr
		}
		t := time.NewTicker(tick)
		defer t.Stop()
		credit := map[taskKey]float64{} // per task: messages it may move now
		last := time.Now()
		for {
			now := time.Now()
			if err := redriveTick(ctx, queues, logger, now.Sub(last), credit); err != nil && ctx.Err() == nil {
				if !sqlerr.Retriable(err) {
					return err
				}
				// A passing failure of the listing (a timeout, a lost connection) is
				// tried again next tick, as a step's is.
				logger.Warn("listing redrive tasks failed; trying again", "err", err)
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
func redriveTick(ctx context.Context, queues *messages.Client, logger *slog.Logger, elapsed time.Duration, credit map[taskKey]float64) error {
	tasks, err := queues.OpenRedriveTasks(ctx, 100)
	if err != nil {
		return err
	}
	open := map[taskKey]bool{}
	for _, t := range tasks {
		k := taskKey{t.DLQ, t.ID}
		open[k] = true
		batch := 1000
		if t.Rate > 0 {
			c := min(credit[k]+t.Rate*elapsed.Seconds(), math.Max(t.Rate, 1))
			credit[k] = c
			if c < 1 {
				continue
			}
			batch = int(min(math.Floor(c), 1e6))
			credit[k] = c - float64(batch)
		}
		if _, _, err := queues.StepRedriveTask(ctx, t.DLQ, t.ID, batch); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if sqlerr.Retriable(err) {
				logger.Warn("redrive task step failed; trying again", "dlq", t.DLQ, "task", t.ID, "err", err)
				continue
			}
			logger.Warn("redrive task failed", "dlq", t.DLQ, "task", t.ID, "err", err)
			if err := queues.FailRedriveTask(ctx, t.DLQ, t.ID, err.Error()); err != nil {
				return err
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
