package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
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
	out, err = runSub(t, newStreamConfigCmd, "set", name, `{"performance_config": {"enableCompression": true, "compressionCodec": "brotli"}}`)
	require.ErrorContains(t, err, "performance_config.compressionCodec", out)
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

// `retention apply` reports a stream another runner holds as busy and goes on with the
// others; a stream that fails for another reason is reported, the others still run,
// and the command exits with an error naming it. It returned at the first error,
// busy included, printing nothing.
func TestCLIRetentionApplyReportsBusyAndGoesOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := streams.NewClient(pool, nil)
	busy, free := testdb.Name("cli-ret-busy"), testdb.Name("cli-ret-free")
	for _, name := range []string{busy, free} {
		require.NoError(t, c.CreateStream(ctx, name, 1))
		recs := make([]streams.Record, 10)
		for i := range recs {
			recs[i] = streams.Record{Stream: name, Data: json.RawMessage(`{}`)}
		}
		_, err := c.Produce(ctx, recs...)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO streamd.retention_policies (stream_name, max_event_count) VALUES ($1, 4)`, name)
		require.NoError(t, err)
	}
	// Another runner holds the first stream (the runner's advisory lock).
	other, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer other.Release()
	_, err = other.Exec(ctx, "SELECT pg_advisory_lock($1, hashtext($2))", int32(0x53445233), busy)
	require.NoError(t, err)

	type line struct {
		retention.StreamResult
		Busy  bool   `json:"busy"`
		Error string `json:"error"`
	}
	decode := func(out string) []line {
		t.Helper()
		var lines []line
		// The first JSON value; an error message may follow it.
		require.NoError(t, json.NewDecoder(strings.NewReader(out)).Decode(&lines), out)
		return lines
	}

	out, err := runSub(t, newRetentionCmd, "apply", "--stream", busy, "--stream", free)
	require.NoError(t, err, "a busy stream is reported, not a failure: %s", out)
	lines := decode(out)
	require.Len(t, lines, 2, out)
	require.Equal(t, busy, lines[0].Stream)
	require.True(t, lines[0].Busy, out)
	require.Equal(t, free, lines[1].Stream)
	require.False(t, lines[1].Busy)
	require.Equal(t, int64(6), lines[1].Deleted(), "the stream after the busy one is applied")
	_, err = c.Fetch(ctx, busy, 0, 0, nil)
	require.NoError(t, err, "the busy stream was left alone")

	_, err = other.Exec(ctx, "SELECT pg_advisory_unlock($1, hashtext($2))", int32(0x53445233), busy)
	require.NoError(t, err)
	missing := "no-such-" + busy
	out, err = runSub(t, newRetentionCmd, "apply", "--stream", missing, "--stream", busy)
	require.ErrorIs(t, err, streams.ErrStreamNotFound, out)
	require.ErrorContains(t, err, missing)
	lines = decode(out)
	require.Len(t, lines, 2, out)
	require.Equal(t, missing, lines[0].Stream)
	require.NotEmpty(t, lines[0].Error)
	require.Equal(t, busy, lines[1].Stream)
	require.Equal(t, int64(6), lines[1].Deleted(), "the stream after the failed one is applied")
}
