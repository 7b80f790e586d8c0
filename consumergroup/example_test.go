package consumergroup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// The README's consumer group quickstart: every worker process runs the same code;
// the group shares the stream's partitions among them and commits after each batch.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, testdb.MustURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	stream := testdb.Name("payments")
	client := streams.NewClient(pool, nil)
	if err := client.CreateStream(ctx, stream, 1); err != nil {
		log.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		data := json.RawMessage(fmt.Sprintf(`{"amount": %d}`, i*10))
		if _, err := client.Produce(ctx, streams.Record{Stream: stream, Key: "acct-1", Data: data}); err != nil {
			log.Fatal(err)
		}
	}

	consumer, err := consumergroup.New(pool, &consumergroup.Config{
		Stream:         stream,
		Group:          "billing",
		SessionTimeout: 10 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	seen := 0
	err = consumer.Run(ctx, func(ctx context.Context, b *consumergroup.Batch) error {
		for _, e := range b.Events {
			fmt.Printf("partition %d offset %d: %s\n", e.Partition, e.Offset, e.Data)
			if seen++; seen == 3 {
				cancel() // a real worker runs until it is told to stop
			}
		}
		return nil // the batch is done: CommitAuto commits its offset (asynchronously, within CommitInterval)
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// partition 0 offset 0: {"amount": 10}
	// partition 0 offset 1: {"amount": 20}
	// partition 0 offset 2: {"amount": 30}
}

// Low latency: one LISTEN connection per process, fed by streamd serve's WAL tailer,
// wakes every consumer (and queue receiver) of the process as soon as a commit lands.
// Polling stays on as the safety net, so nothing depends on it for correctness.
func Example_wakeups() {
	ctx := context.Background()
	databaseURL := os.Getenv("STREAMD_DATABASE_URL")
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	listener, err := wakeup.NewListener(&wakeup.ListenerConfig{ConnString: databaseURL})
	if err != nil {
		log.Fatal(err)
	}
	go listener.Run(ctx) // returns when ctx ends

	consumer, err := consumergroup.New(pool, &consumergroup.Config{
		Stream:  "orders",
		Group:   "billing",
		Wakeups: listener.Hub,
	})
	if err != nil {
		log.Fatal(err)
	}
	queues, err := messages.NewClient(pool, &messages.ClientConfig{Wakeups: listener.Hub})
	if err != nil {
		log.Fatal(err)
	}
	_, _ = consumer, queues
}

// Stopping cleanly: on SIGTERM, Run's ctx ends; the batches in flight keep their own
// ctx, finish and commit (up to DrainTimeout), OnRevoked runs and the member leaves,
// so the other members take its partitions at once. OnLost is the other case: the
// partitions went without a clean handover (session expired, fenced), another member
// may own them already, and their uncommitted work will be done again there. Both
// name the membership, as Batch.MemberID and Batch.MemberEpoch do.
func Example_stopping() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, testdb.MustURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	consumer, err := consumergroup.New(pool, &consumergroup.Config{
		Stream:       "orders",
		Group:        "billing",
		DrainTimeout: 20 * time.Second,
		OnRevoked: func(ctx context.Context, m consumergroup.Membership, partitions []int32) {
			log.Printf("%s (epoch %d) handed over %v: committed, nothing to redo", m.MemberID, m.MemberEpoch, partitions)
		},
		OnLost: func(ctx context.Context, m consumergroup.Membership, partitions []int32) {
			log.Printf("%s (epoch %d) lost %v: drop their state, do not commit", m.MemberID, m.MemberEpoch, partitions)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = consumer.Run(ctx, func(ctx context.Context, b *consumergroup.Batch) error {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// ... the batch's writes, in tx ...
			return b.CommitTx(ctx, tx)
		})
		var fenced *consumergroup.FencedError
		if errors.As(err, &fenced) {
			log.Printf("batch of partition %d refused: %s", b.Partition, fenced.Reason)
		}
		return err
	})
}
