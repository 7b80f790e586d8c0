// Command projection keeps a read model, one balance per account, from the events of
// a stream, exactly once, with package projection: each batch's states and its
// offset commit happen in one transaction (consumergroup.CommitTransactional,
// Batch.CommitTx). A crash anywhere leaves both or neither, and a redelivered batch
// finds its events already applied (each state stores the last applied event, as the
// projections of seeds 000 and 001 do), so even a replay after an offset reset
// applies nothing twice.
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
	"github.com/streamd/streamd/projection"
	"github.com/streamd/streamd/streams"
)

// Deposit is the event payload: {"amount": 10}; the event key is the account.
type Deposit struct {
	Amount int64 `json:"amount"`
}

// Balance is the projection's state of an account.
type Balance struct {
	Balance int64 `json:"balance"`
}

// ProjectionType names the projection of stream's balances.
func ProjectionType(stream string) string { return "balance:" + stream }

// deposit adds an event's amount to a balance.
func deposit(state json.RawMessage, e *streams.Event) (json.RawMessage, error) {
	var b Balance
	if state != nil {
		if err := json.Unmarshal(state, &b); err != nil {
			return nil, err
		}
	}
	var d Deposit
	if err := json.Unmarshal(e.Data, &d); err != nil {
		return nil, fmt.Errorf("event %s/%d@%d: %w", e.Stream, e.Partition, e.Offset, err)
	}
	b.Balance += d.Amount
	return json.Marshal(b)
}

// Project runs the projection of stream for group until ctx is cancelled.
func Project(ctx context.Context, pool *pgxpool.Pool, stream, group string, logger *slog.Logger) error {
	store := projection.NewStore(pool)
	c, err := consumergroup.New(pool, &consumergroup.Config{
		Stream: stream, Group: group, CommitMode: consumergroup.CommitTransactional, Logger: logger,
	})
	if err != nil {
		return err
	}
	return c.Run(ctx, func(ctx context.Context, b *consumergroup.Batch) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for i := range b.Events {
				e := &b.Events[i]
				if _, err := store.ApplyTx(ctx, tx, ProjectionType(stream), e.Key, e, deposit); err != nil {
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
