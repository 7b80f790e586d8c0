package streams_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// TestFetchWakesOnWakeup: a long-polling Fetch whose poll interval is an hour returns
// a new event because its Wakeups hub reported the commit, not because it polled.
func TestFetchWakesOnWakeup(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, s := setup(t, 2)
	hub := wakeup.NewHub()

	type result struct {
		res *streams.FetchResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := c.Fetch(ctx, s, 1, 0, &streams.FetchOpts{MaxWait: time.Minute, PollInterval: time.Hour, Wakeups: hub})
		done <- result{res, err}
	}()
	// A commit to another partition wakes nobody watching partition 1.
	_, err := c.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(0), Data: json.RawMessage(`0`)})
	require.NoError(t, err)
	hub.NotifyPartitions(s, 0)
	_, err = c.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(1), Data: json.RawMessage(`1`)})
	require.NoError(t, err)
	hub.NotifyPartitions(s, 1)
	select {
	case r := <-done:
		require.NoError(t, r.err)
		require.Len(t, r.res.Events, 1)
		require.JSONEq(t, `1`, string(r.res.Events[0].Data))
	case <-ctx.Done():
		t.Fatal("the fetch was not woken by the wake-up")
	}
}

// TestLongPollFetchEndedByContext: a long-polling Fetch whose ctx ends while it waits
// returns ctx's error, promptly, whether it waits on a timer or on a Wakeup (as a
// queue's long-poll Receive does), not an empty result that reads as "nothing yet".
func TestLongPollFetchEndedByContext(t *testing.T) {
	t.Parallel()
	c, s := setup(t, 1)
	hub := wakeup.NewHub()
	for name, opts := range map[string]*streams.FetchOpts{
		"timer":  {MaxWait: time.Minute, PollInterval: time.Hour},
		"wakeup": {MaxWait: time.Minute, PollInterval: time.Hour, Wakeups: hub},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			start := time.Now()
			res, err := c.Fetch(ctx, s, 0, 0, opts)
			require.ErrorIs(t, err, context.Canceled)
			require.Nil(t, res)
			require.Less(t, time.Since(start), 10*time.Second, "the fetch waited past its ctx")

			dctx, dcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer dcancel()
			_, err = c.Fetch(dctx, s, 0, 0, opts)
			require.ErrorIs(t, err, context.DeadlineExceeded)
		})
	}
}
