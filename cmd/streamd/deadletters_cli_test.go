package main

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
	"github.com/streamd/streamd/streams"
)

// TestCLIDeadLetterVocabulary: `dlq list DLQ --status`, `dlq replay --id`, `dlq discard
// --id`, `dlq resolve` and `groups dead-letters resolve` settle dead letters by id with
// who did it, and list them by status; ids that could not be settled are an error.
func TestCLIDeadLetterVocabulary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	qc, err := messages.NewClient(pool, nil)
	require.NoError(t, err)
	q, dlq := testdb.Name("q"), testdb.Name("dlq")
	require.NoError(t, qc.CreateQueue(ctx, dlq, nil))
	require.NoError(t, qc.CreateQueue(ctx, q, &messages.QueueConfig{MaxDeliveryAttempts: 1, DeadLetterQueue: dlq}))
	for _, id := range []string{"a", "b", "c"} {
		_, err := qc.Send(ctx, q, messages.OutgoingMessage{MessageID: id, Data: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	got, err := qc.Receive(ctx, q, &messages.ReceiveOpts{Max: 3})
	require.NoError(t, err)
	for _, m := range got {
		require.NoError(t, qc.Nack(ctx, &messages.NackOpts{Error: "bad"}, m.Receipt))
	}
	out, err := runQueueCLI(t, "", "dlq", "list", dlq, "--status", "pending")
	require.NoError(t, err)
	var listed []messages.DeadLetter
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	require.Len(t, listed, 3)

	_, err = runQueueCLI(t, "", "dlq", "replay", dlq, "--id", "a", "--by", "alice")
	require.NoError(t, err)
	_, err = runQueueCLI(t, "", "dlq", "discard", dlq, "--id", "b", "--by", "bob")
	require.NoError(t, err)
	_, err = runQueueCLI(t, "", "dlq", "resolve", dlq, "c", "--by", "carol")
	require.NoError(t, err)
	_, err = runQueueCLI(t, "", "dlq", "resolve", dlq, "c", "--by", "carol")
	require.ErrorContains(t, err, "1 of 1 dead letters not resolved")
	_, err = runQueueCLI(t, "", "dlq", "discard", dlq, "--id", "b", "7")
	require.ErrorContains(t, err, "one of them")
	for status, who := range map[string]string{"replayed": "alice", "discarded": "bob", "resolved": "carol"} {
		out, err := runQueueCLI(t, "", "dlq", "list", dlq, "--status", status)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal([]byte(out), &listed))
		require.Len(t, listed, 1, status)
		require.Equal(t, who, listed[0].ResolvedBy)
	}
	_, err = runQueueCLI(t, "", "dlq", "list", dlq, "--status", "bogus")
	require.ErrorIs(t, err, messages.ErrInvalidArgument)

	// A group's dead letter, resolved from the CLI.
	s := testdb.Name("cli-dl")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, s, 1))
	_, err = sc.Produce(ctx, streams.Record{Stream: s, Data: json.RawMessage(`{}`)})
	require.NoError(t, err)
	cons, err := consumergroup.New(pool, &consumergroup.Config{Stream: s, Group: "g", SessionTimeout: 5 * time.Second,
		OnHandlerError: consumergroup.ErrorDeadLetter, MaxRetries: consumergroup.NoRetries, FetchMaxWait: 50 * time.Millisecond})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- cons.Run(rctx, func(context.Context, *consumergroup.Batch) error { return errors.New("no") })
	}()
	admin := consumergroup.NewAdmin(pool)
	var dl []consumergroup.DeadLetter
	testdb.WaitFor(t, 30*time.Second, "a dead letter", func() bool {
		dl, err = admin.DeadLetters(ctx, s, "g", "pending")
		require.NoError(t, err)
		return len(dl) == 1
	})
	stop()
	require.NoError(t, <-done)
	out, err = run(t, ctx, "", "groups", "dead-letters", "resolve", "1x", "--stream", s)
	require.ErrorContains(t, err, "want a number", out)
	out, err = run(t, ctx, "", "groups", "--stream", s, "dead-letters", "resolve", strconv.FormatInt(dl[0].ID, 10), "--by", "dave")
	require.NoError(t, err, out)
	out, err = run(t, ctx, "", "groups", "--stream", s, "dead-letters", "--status", "resolved")
	require.NoError(t, err, out)
	require.Contains(t, out, "dave")
}

// TestCLIAdvisories: `streamd advisories` prints the advisory stream's recent
// advisories (here, a group's dead letter), filtered by type; -o json gives one
// object per line; an unknown type is refused.
func TestCLIAdvisories(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	s := testdb.Name("cli-adv")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, s, 1))
	var epoch int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.join_group($1, 'g', 'm', NULL, 60000, 60000, NULL)", s).Scan(&epoch))
	out, err := run(t, ctx, "", "advisories", "--since", "1h", "--type", "streamd.group.rebalanced")
	require.NoError(t, err, out)
	require.Contains(t, out, s+"/g")
	require.NotContains(t, out, "streamd.group.dead_lettered")
	out, err = run(t, ctx, "", "advisories", "--since", "1h", "-o", "json")
	require.NoError(t, err, out)
	found := false
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var a struct {
			Type string          `json:"type"`
			Key  string          `json:"key"`
			Data json.RawMessage `json:"data"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &a), line)
		if a.Key == s+"/g" && a.Type == "streamd.group.rebalanced" {
			found = true
		}
	}
	require.True(t, found, "the rebalance is in the JSON lines")
	_, err = run(t, ctx, "", "advisories", "--type", "nope")
	require.ErrorContains(t, err, "--type")
}
