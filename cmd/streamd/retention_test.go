package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/retention"
	"github.com/streamd/streamd/streams"
)

// runSub executes a subcommand built by mk with the test database and JSON output
// (the commands need not be wired under the root for this).
func runSub(t *testing.T, mk func(*globals) *cobra.Command, args ...string) (string, error) {
	t.Helper()
	g := &globals{databaseURL: testdb.URL(t), output: "json", logFormat: "text", logLevel: "error"}
	require.NoError(t, g.init(io.Discard))
	cmd := mk(g)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestCLIRetentionAndStreamConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := streams.NewClient(testdb.Pool(t), nil)
	name := testdb.Name("cli-ret")
	require.NoError(t, c.CreateStream(ctx, name, 1))
	recs := make([]streams.Record, 10)
	for i := range recs {
		recs[i] = streams.Record{Stream: name, Data: json.RawMessage(`{}`)}
	}
	_, err := c.Produce(ctx, recs...)
	require.NoError(t, err)

	out, err := runSub(t, newStreamConfigCmd, "set", name, `{"retention_config": {"maxEventCount": 4, "maxAge": "90.00:00:00"}, "tags": {"a": "b"}}`)
	require.NoError(t, err, out)
	out, err = runSub(t, newStreamConfigCmd, "set", name, `{"performance_config": {"batchSize": 10}}`)
	require.NoError(t, err, out)
	out, err = runSub(t, newStreamConfigCmd, "get", name)
	require.NoError(t, err, out)
	require.Contains(t, out, `"maxAge": "90.00:00:00"`)
	require.Contains(t, out, `"maxEventCount": 4`)
	require.Contains(t, out, `"batchSize": 10`, "set keeps the sections not given")

	out, err = runSub(t, newStreamConfigCmd, "set", name, `{"retention_config": {"maxEventCount": -4}}`)
	require.ErrorContains(t, err, "retention_config.maxEventCount", out)
	// A misspelt key is refused, not read as an empty section (no retention at all).
	out, err = runSub(t, newStreamConfigCmd, "set", name, `{"retention_config": {"max_age": "1.00:00:00"}}`)
	require.ErrorContains(t, err, "max_age", out)
	out, err = runSub(t, newStreamConfigCmd, "get", name)
	require.NoError(t, err, out)
	require.Contains(t, out, `"maxEventCount": 4`, "the refused set changed nothing")

	out, err = runSub(t, newRetentionCmd, "apply", "--dry-run", "--stream", name)
	require.NoError(t, err, out)
	var dry []retention.StreamResult
	require.NoError(t, json.Unmarshal([]byte(out), &dry), out)
	require.Len(t, dry, 1)
	require.Equal(t, int64(6), dry[0].Deleted())
	res, err := c.Fetch(ctx, name, 0, 0, nil)
	require.NoError(t, err, "the dry run deleted nothing")
	require.Len(t, res.Events, 10)

	out, err = runSub(t, newRetentionCmd, "apply", "--stream", name)
	require.NoError(t, err, out)
	var real []retention.StreamResult
	require.NoError(t, json.Unmarshal([]byte(out), &real), out)
	require.Equal(t, int64(6), real[0].Deleted())
	_, err = c.Fetch(ctx, name, 0, 5, nil)
	require.ErrorIs(t, err, streams.ErrOffsetOutOfRange)
}
