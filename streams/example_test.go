package streams_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// databaseURL stands in for the application's own connection string.
func databaseURL() string { return testdb.MustURL() }

// The README's quickstart: create a stream, produce with a batching producer, and
// read a partition back by offset.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	client := streams.NewClient(pool, nil)
	stream := testdb.Name("orders")
	if err := client.CreateStream(ctx, stream, 4); err != nil {
		log.Fatal(err)
	}

	producer, err := streams.NewProducer(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close(ctx)
	pos, err := producer.Produce(ctx, streams.Record{
		Stream:    stream,
		Key:       "customer-42", // same key, same partition, in order
		EventType: "OrderPlaced",
		Data:      json.RawMessage(`{"order_id": 1, "total": 9.5}`),
		Headers:   map[string]string{"source": "checkout"},
	})
	if err != nil {
		log.Fatal(err)
	}

	res, err := client.Fetch(ctx, stream, pos.Partition, 0, &streams.FetchOpts{MaxRecords: 100})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range res.Events {
		fmt.Println(e.Offset, e.EventType, string(e.Data), e.Headers["source"])
	}
	// Output: 0 OrderPlaced {"total": 9.5, "order_id": 1} checkout
}
