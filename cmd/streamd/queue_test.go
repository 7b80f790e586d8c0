package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// runQueueCLI runs the queue and dlq commands in-process against the test database,
// with JSON output.
func runQueueCLI(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	g := &globals{databaseURL: testdb.URL(t), output: "json"}
	root := &cobra.Command{Use: "streamd", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(newQueueCmd(g), newDLQCmd(g))
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestCLIQueueAndDLQ(t *testing.T) {
	t.Parallel()
	dlq, q := testdb.Name("dlq"), testdb.Name("q")
	_, err := runQueueCLI(t, "", "queue", "create", dlq)
	require.NoError(t, err)
	_, err = runQueueCLI(t, "", "queue", "create", q, "--max-attempts", "1", "--dead-letter-queue", dlq)
	require.NoError(t, err)
	// Changing one setting keeps the others (the defaults used to replace them: the
	// dead-letter queue was dropped, max attempts went back to 5).
	out, err := runQueueCLI(t, "", "queue", "create", q, "--visibility-timeout", "45s")
	require.NoError(t, err)
	require.Contains(t, out, `"dead_letter_queue": "`+dlq+`"`)
	require.Contains(t, out, `"max_delivery_attempts": 1`)
	require.Contains(t, out, `"visibility_timeout_ms": 45000`, "milliseconds, named in the field")
	out, err = runQueueCLI(t, "{\"n\":1}\n{\"n\":2}\n", "queue", "send", q, "--header", "k=v")
	require.NoError(t, err)
	var sent []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &sent))
	require.Len(t, sent, 2)

	_, err = runQueueCLI(t, "", "queue", "send", q, "not json")
	require.ErrorContains(t, err, "invalid JSON")
	_, err = runQueueCLI(t, "", "queue", "receive", q, "--max", "0")
	require.ErrorContains(t, err, "--max 0: must be more than 0", "receiving 0 messages is refused, not read as 1")
	// An explicit 0 is refused, not replaced by the library's default.
	for _, args := range [][]string{
		{"queue", "create", q + "-zero", "--max-attempts", "0"},
		{"queue", "create", q + "-zero", "--max-payload", "0"},
		{"queue", "create", q + "-zero", "--visibility-timeout", "0s"},
		{"dlq", "list", dlq, "--limit", "0"},
		{"dlq", "replay", dlq, "--batch", "0"},
	} {
		_, err = runQueueCLI(t, "", args...)
		require.ErrorContains(t, err, ": must be more than 0", "%v", args)
	}
	_, err = runQueueCLI(t, "", "queue", "stats", q+"-zero")
	require.ErrorContains(t, err, "not found", "no queue was created")

	out, err = runQueueCLI(t, "", "queue", "receive", q, "-n", "1", "--ack")
	require.NoError(t, err)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Len(t, got, 1)
	require.Equal(t, map[string]any{"n": float64(1)}, got[0]["data"])

	// The second message: received once (its only attempt) with a 1ms lease, then
	// dead-lettered by the next receive.
	_, err = runQueueCLI(t, "", "queue", "receive", q, "--visibility-timeout", "1ms")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		out, err := runQueueCLI(t, "", "queue", "receive", q)
		require.NoError(t, err)
		require.Equal(t, "[]", strings.TrimSpace(out))
		out, err = runQueueCLI(t, "", "dlq", "list", dlq)
		require.NoError(t, err)
		return strings.Contains(out, `"queue": "`+q+`"`)
	}, 5*time.Second, 10*time.Millisecond)

	out, err = runQueueCLI(t, "", "queue", "stats", q)
	require.NoError(t, err)
	var st []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Equal(t, float64(1), st[0]["dead_lettered"])

	out, err = runQueueCLI(t, "", "dlq", "replay", dlq, "--rate", "0")
	require.NoError(t, err)
	require.Contains(t, out, `"replayed": 1`)
	out, err = runQueueCLI(t, "", "queue", "purge", q)
	require.NoError(t, err)
	require.Contains(t, out, `"purged": 1`)
	out, err = runQueueCLI(t, "", "dlq", "discard", dlq, "--all")
	require.NoError(t, err)
	require.Contains(t, out, `"discarded": 0`)
	_, err = runQueueCLI(t, "", "queue", "stats", testdb.Name("missing"))
	require.ErrorContains(t, err, "queue not found")
}

// TestCLIDLQDiscardAllKeepsInFlight: dlq discard --all deletes the dead letters not
// in flight, as discarding them by offset does; it purged the queue, in-flight
// messages included (and any queue named by mistake).
func TestCLIDLQDiscardAllKeepsInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := messages.NewClient(pool, nil)
	require.NoError(t, err)
	dlq := testdb.Name("dlq-all")
	require.NoError(t, c.CreateQueue(ctx, dlq, nil))
	t.Cleanup(func() { _ = c.DeleteQueue(context.Background(), dlq) })
	_, err = c.Send(ctx, dlq, messages.OutgoingMessage{Data: json.RawMessage(`1`)}, messages.OutgoingMessage{Data: json.RawMessage(`2`)})
	require.NoError(t, err)
	leased, err := c.Receive(ctx, dlq, nil) // one in flight
	require.NoError(t, err)
	require.Len(t, leased, 1)
	out, err := runQueueCLI(t, "", "dlq", "discard", dlq, "--all")
	require.NoError(t, err)
	require.Contains(t, out, `"discarded": 1`)
	require.NoError(t, c.Ack(ctx, leased[0].Receipt), "the message in flight was kept")
}

// TestCLIDLQDiscardByOffsetSaysWhatItDidNotDiscard: offsets named to dlq discard that
// it did not discard (not there, or in flight) make it fail after printing what it
// did, as discarding by --id does; it exited 0 whatever it found.
func TestCLIDLQDiscardByOffsetSaysWhatItDidNotDiscard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := messages.NewClient(pool, nil)
	require.NoError(t, err)
	dlq := testdb.Name("dlq-offs")
	require.NoError(t, c.CreateQueue(ctx, dlq, nil))
	t.Cleanup(func() { _ = c.DeleteQueue(context.Background(), dlq) })
	sent, err := c.Send(ctx, dlq, messages.OutgoingMessage{Data: json.RawMessage(`1`)},
		messages.OutgoingMessage{Data: json.RawMessage(`2`)}, messages.OutgoingMessage{Data: json.RawMessage(`3`)})
	require.NoError(t, err)
	leased, err := c.Receive(ctx, dlq, nil) // the first, in flight
	require.NoError(t, err)
	require.Len(t, leased, 1)
	require.Equal(t, sent[0].Offset, leased[0].Offset)
	off := func(i int) string { return strconv.FormatInt(sent[i].Offset, 10) }

	out, err := runQueueCLI(t, "", "dlq", "discard", dlq, off(1))
	require.NoError(t, err)
	require.Contains(t, out, `"discarded": 1`)
	out, err = runQueueCLI(t, "", "dlq", "discard", dlq, off(0), off(1), off(2), off(2), "999999")
	require.ErrorContains(t, err, "3 of 4 dead letters not discarded")
	require.Contains(t, out, `"discarded": 1`, "what it did is printed first")
	require.NoError(t, c.Ack(ctx, leased[0].Receipt), "the message in flight was kept")
}
