package wakeup_test

import (
	"context"
	"log"
	"time"

	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// A reader of one partition: each Fetch reads by offset through SQL and, when it
// finds nothing, long-polls (wakeup.Poll) until a wake-up for the partition or its
// poll interval, whichever comes first. streamd runs the Broadcaster; each worker
// process runs one Listener for all its readers.
func Example() {
	ctx := context.Background()
	url := "host=/run/postgresql dbname=streamd"

	l, err := wakeup.NewListener(&wakeup.ListenerConfig{ConnString: url})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = l.Run(ctx) }() // owner: main; exits when ctx ends

	var client *streams.Client // streams.NewClient(pool, nil)
	opts := &streams.FetchOpts{MaxWait: 30 * time.Second, Wakeups: l.Hub}
	var offset int64
	for ctx.Err() == nil {
		res, err := client.Fetch(ctx, "orders", 3, offset, opts)
		if err != nil {
			log.Fatal(err)
		}
		for range res.Events {
			// handle the event
		}
		offset = res.NextOffset
	}
}

// Any other reader waits the same way: Poll calls try at once and again at each
// wake-up of the subscription or poll interval (10ms doubling to 1s by default),
// until try is done, the deadline passes or ctx ends.
func ExamplePoll() {
	ctx := context.Background()
	hub := wakeup.NewHub()                           // or a Listener's Hub
	sub := hub.Subscribe(wakeup.KindQueue, "emails") // before the first try
	defer sub.Close()
	err := wakeup.Poll(ctx, sub, time.Now().Add(10*time.Second), nil, func() (bool, error) {
		found := false // read through SQL here
		return found, nil
	})
	if err != nil {
		log.Fatal(err) // ctx ended, or the read failed
	}
}
