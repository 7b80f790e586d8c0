package wakeup_test

import (
	"context"
	"log"

	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// A reader of one partition: fetch by offset through SQL, and between fetches wait
// for a wake-up or the poll interval, whichever comes first. streamd runs the
// Broadcaster; each worker process runs one Listener for all its readers.
func Example() {
	ctx := context.Background()
	url := "host=/run/postgresql dbname=streamd"

	l, err := wakeup.NewListener(&wakeup.ListenerConfig{ConnString: url})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = l.Run(ctx) }() // owner: main; exits when ctx ends

	var client *streams.Client // streams.NewClient(pool, nil)
	sub := l.SubscribePartition("orders", 3)
	defer sub.Close()
	w, err := wakeup.NewWaiter(sub, nil) // polls at 10ms doubling to 1s without wake-ups
	if err != nil {
		log.Fatal(err)
	}
	var offset int64
	for ctx.Err() == nil {
		res, err := client.Fetch(ctx, "orders", 3, offset, nil)
		if err != nil {
			log.Fatal(err)
		}
		for range res.Events {
			// handle the event
		}
		offset = res.NextOffset
		if len(res.Events) > 0 {
			w.Reset()
			continue
		}
		w.Wait(ctx)
	}
}
