package consumergroup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

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
		return nil // the batch's offsets are committed (CommitAuto)
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
