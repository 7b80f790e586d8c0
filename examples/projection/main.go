// Command projection keeps a read model, one balance row per account, from the events
// of a stream, exactly once: each batch's upserts and its offset commit happen in one
// transaction (consumergroup.CommitTransactional, Batch.CommitTx). A crash anywhere
// leaves both or neither, and a redelivered batch finds its events already applied
// (each row stores the last applied offset, as the projections of seeds 000 and 001
// do), so even a replay after an offset reset applies nothing twice.
//
//	STREAMD_DATABASE_URL=postgres://... go run ./examples/projection
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/streams"
)

const schema = `CREATE TABLE IF NOT EXISTS account_balances (
    stream_name text   NOT NULL,
    account     text   NOT NULL,
    balance     bigint NOT NULL,
    partition   integer NOT NULL,  -- the last applied event: its partition and offset
    last_offset bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_name, account)
)`

// apply upserts one event's effect unless the row already reflects it: events of
// one account share a key, hence a partition, and arrive in offset order.
const apply = `INSERT INTO account_balances AS b (stream_name, account, balance, partition, last_offset)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (stream_name, account) DO UPDATE
   SET balance = b.balance + EXCLUDED.balance, partition = EXCLUDED.partition,
       last_offset = EXCLUDED.last_offset, updated_at = now()
 WHERE b.last_offset < EXCLUDED.last_offset`

// Deposit is the event payload: {"amount": 10}; the event key is the account.
type Deposit struct {
	Amount int64 `json:"amount"`
}

// Project runs the projection of stream for group until ctx is cancelled.
func Project(ctx context.Context, pool *pgxpool.Pool, stream, group string, logger *slog.Logger) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create read model: %w", err)
	}
	c, err := consumergroup.New(pool, &consumergroup.Config{
		Stream: stream, Group: group, CommitMode: consumergroup.CommitTransactional, Logger: logger,
	})
	if err != nil {
		return err
	}
	return c.Run(ctx, func(ctx context.Context, b *consumergroup.Batch) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, e := range b.Events {
				var d Deposit
				if err := json.Unmarshal(e.Data, &d); err != nil {
					return fmt.Errorf("event %s/%d@%d: %w", e.Stream, e.Partition, e.Offset, err)
				}
				if _, err := tx.Exec(ctx, apply, e.Stream, e.Key, d.Amount, e.Partition, e.Offset); err != nil {
					return err
				}
			}
			return b.CommitTx(ctx, tx)
		})
	})
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("STREAMD_DATABASE_URL"))
	if err != nil {
		slog.Error("connect", "error", err)
		os.Exit(1)
	}
	defer pool.Close()
	if err := streams.NewClient(pool, nil).CreateStream(ctx, "deposits", 4); err != nil {
		slog.Error("create stream", "error", err)
		os.Exit(1)
	}
	if err := Project(ctx, pool, "deposits", "balances", slog.Default()); err != nil {
		slog.Error("projection", "error", err)
		os.Exit(1)
	}
}
