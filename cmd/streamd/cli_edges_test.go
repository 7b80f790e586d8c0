package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
	schema "github.com/streamd/streamd/sql"
	"github.com/streamd/streamd/streams"
)

// committedGroup makes a stream of 2 partitions with 4 records and a group that read
// and committed them all, then left.
func committedGroup(t *testing.T, ctx context.Context) (stream, group string) {
	t.Helper()
	sc := streams.NewClient(testdb.Pool(t), nil)
	stream, group = testdb.Name("cli-grp"), "g1"
	require.NoError(t, sc.CreateStream(ctx, stream, 2))
	for i := 0; i < 4; i++ {
		_, err := sc.Produce(ctx, streams.Record{Stream: stream, Partition: streams.PartitionOf(int32(i % 2)), Data: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	cons, err := consumergroup.New(sc.Pool(), &consumergroup.Config{Stream: stream, Group: group, SessionTimeout: 5 * time.Second})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	seen := 0
	require.NoError(t, cons.Run(rctx, func(ctx context.Context, b *consumergroup.Batch) error {
		if seen += len(b.Events); seen == 4 {
			stop()
		}
		return nil
	}))
	return stream, group
}

// TestCLIResetOffsetsPreviewsUnlessExecute: reset-offsets prints the offsets it would
// set and changes nothing unless --execute (kafka-consumer-groups' --dry-run default);
// --execute resets.
func TestCLIResetOffsetsPreviewsUnlessExecute(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stream, group := committedGroup(t, ctx)
	lag := func() int64 {
		d, err := consumergroup.NewAdmin(testdb.Pool(t)).DescribeGroup(ctx, stream, group)
		require.NoError(t, err)
		return d.Lag
	}
	require.EqualValues(t, 0, lag())

	out, err := run(t, ctx, "", "-O", "json", "groups", "reset-offsets", group, "--stream", stream, "--to-earliest")
	require.NoError(t, err, out)
	var changes []consumergroup.OffsetChange
	require.NoError(t, json.Unmarshal([]byte(out), &changes), out)
	require.Len(t, changes, 2)
	require.EqualValues(t, 0, changes[0].New)
	require.EqualValues(t, 0, lag(), "a preview changes nothing")

	out, err = run(t, ctx, "", "groups", "reset-offsets", group, "--stream", stream, "--to-earliest", "--execute", "--dry-run")
	require.ErrorContains(t, err, "choose one", out)
	out, err = run(t, ctx, "", "groups", "reset-offsets", group, "--stream", stream, "--to-earliest", "--execute")
	require.NoError(t, err, out)
	require.EqualValues(t, 4, lag(), "--execute resets")
}

// TestServeRefusesBadSettingsBeforeTouchingTheDatabase: a token that is too short is
// refused before serve connects: the database is left unmigrated. It used to migrate
// first.
func TestServeRefusesBadSettingsBeforeTouchingTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.FreshDatabase(t)
	cmd := newRootCmd()
	cmd.SetArgs([]string{"--database-url", url, "serve", "--auth-token", "short", "--http-addr", freeAddr(t)})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.ExecuteContext(ctx)
	require.ErrorContains(t, err, "shorter than 16 characters")
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.ErrorIs(t, schema.Check(ctx, conn), schema.ErrNotMigrated, "nothing migrated")
}

// TestCLIProduceRefusesInvalidJSONAndCreateRefusesExisting: produce refuses a line
// that is not JSON (it stored `{bad` as a JSON string) and names it, skips empty lines
// and says so, and produces the rest; --string stores any text. stream create on an
// existing stream is refused and changes nothing (it grew it); stream alter grows.
func TestCLIProduceRefusesInvalidJSONAndCreateRefusesExisting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testdb.Name("cli-json")
	_, err := run(t, ctx, "", "stream", "create", s, "--partitions", "2")
	require.NoError(t, err)

	out, err := run(t, ctx, "{\"n\":1}\n{bad\n\n{\"n\":3}\n", "produce", s, "--partition", "0")
	require.ErrorContains(t, err, "1 of 3 records failed")
	require.Contains(t, out, "line 2: not valid JSON")
	require.Contains(t, out, "line 3: empty: skipped")
	require.Contains(t, out, s+"/0@0")
	require.Contains(t, out, s+"/0@1", "the lines around it are produced")
	out, err = run(t, ctx, "{bad\n", "produce", s, "--partition", "0", "--string")
	require.NoError(t, err, out)
	out, err = run(t, ctx, "", "fetch", s, "--partition", "0", "--offset", "2")
	require.NoError(t, err)
	require.Contains(t, out, `"data":"{bad"`)
	out, err = run(t, ctx, "k1:{\"n\":4}\n", "produce", s, "-K", ":", "-O", "json")
	require.NoError(t, err, out)
	out, err = run(t, ctx, "", "fetch", s, "--partition", "0", "--offset", "3")
	require.NoError(t, err)
	out2, err := run(t, ctx, "", "fetch", s, "--partition", "1", "--offset", "0")
	require.NoError(t, err)
	require.Contains(t, out+out2, `"key":"k1"`, "the key before the delimiter")

	_, err = run(t, ctx, "", "stream", "create", s, "--partitions", "3")
	require.ErrorIs(t, err, streams.ErrStreamExists)
	info, err := streams.NewClient(testdb.Pool(t), nil).DescribeStream(ctx, s)
	require.NoError(t, err)
	require.Len(t, info.PartitionInfo, 2, "a refused create changes nothing")
	_, err = run(t, ctx, "", "stream", "alter", s, "--partitions", "3")
	require.NoError(t, err)
	info, err = streams.NewClient(testdb.Pool(t), nil).DescribeStream(ctx, s)
	require.NoError(t, err)
	require.Len(t, info.PartitionInfo, 3)
	// A refused alter changes nothing: --max-payload was written before the grow
	// (fewer partitions, or more than 10000) or the payload limit itself failed.
	limit := info.MaxPayloadBytes
	for _, bad := range [][]string{{"--partitions", "2", "--max-payload", "2000"},
		{"--partitions", "20000", "--max-payload", "2000"}, {"--partitions", "4", "--max-payload", "0"}} {
		_, err = run(t, ctx, "", append([]string{"stream", "alter", s}, bad...)...)
		require.Error(t, err, "%v", bad)
		info, err = streams.NewClient(testdb.Pool(t), nil).DescribeStream(ctx, s)
		require.NoError(t, err)
		require.Len(t, info.PartitionInfo, 3, "%v wrote nothing", bad)
		require.Equal(t, limit, info.MaxPayloadBytes, "%v wrote nothing", bad)
	}
}

// TestCLIQueueSettleByReceiptAndVersion: the receipt that receive prints (table and
// JSON) is what queue ack, nack and extend take; a malformed one is refused naming
// it. streamd version and --version print the version and the schema migration.
func TestCLIQueueSettleByReceiptAndVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := testdb.Name("cli-settle")
	_, err := run(t, ctx, "", "queue", "create", q)
	require.NoError(t, err)
	_, err = run(t, ctx, "{\"n\":1}\n{\"n\":2}\n", "queue", "send", q)
	require.NoError(t, err)

	out, err := run(t, ctx, "", "-O", "json", "queue", "receive", q, "--max", "2")
	require.NoError(t, err)
	var got []struct {
		ReceiptHandle string `json:"receipt_handle"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Len(t, got, 2)
	out, err = run(t, ctx, "", "queue", "extend", got[0].ReceiptHandle, "--visibility-timeout", "1m")
	require.NoError(t, err, out)
	out, err = run(t, ctx, "", "queue", "ack", got[0].ReceiptHandle)
	require.NoError(t, err, out)
	out, err = run(t, ctx, "", "queue", "nack", got[1].ReceiptHandle)
	require.NoError(t, err, out)
	_, err = run(t, ctx, "", "queue", "ack", got[0].ReceiptHandle)
	require.ErrorIs(t, err, messages.ErrLeaseLost, "acked already")
	_, err = run(t, ctx, "", "queue", "ack", q+"/x/abc")
	require.ErrorContains(t, err, q+"/x/abc")

	out, err = run(t, ctx, "", "queue", "receive", q)
	require.NoError(t, err)
	require.Contains(t, out, q+"/", "the table shows the receipt")
	require.Contains(t, out, `{"n": 2}`, "the nacked message is back")

	out, err = run(t, ctx, "", "version")
	require.NoError(t, err)
	require.Contains(t, out, "streamd ")
	require.Contains(t, out, "schema migration")
	out, err = run(t, ctx, "", "--version")
	require.NoError(t, err)
	require.Contains(t, out, "schema migration")
}

// TestCLIRedriveTasks: dlq task create, list and cancel call the library's redrive
// task methods, as the API does.
func TestCLIRedriveTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dlq := testdb.Name("cli-task")
	_, err := run(t, ctx, "", "queue", "create", dlq)
	require.NoError(t, err)
	out, err := run(t, ctx, "", "-O", "json", "dlq", "task", "create", dlq, "--max", "5")
	require.NoError(t, err, out)
	var tasks []messages.RedriveTask
	require.NoError(t, json.Unmarshal([]byte(out), &tasks), out)
	require.Len(t, tasks, 1)
	require.Equal(t, messages.RedriveTaskPending, tasks[0].Status)
	out, err = run(t, ctx, "", "dlq", "task", "list", "--status", "pending")
	require.NoError(t, err)
	require.Contains(t, out, dlq)
	out, err = run(t, ctx, "", "dlq", "task", "cancel", dlq, strconv.FormatInt(tasks[0].ID, 10))
	require.NoError(t, err, out)
	require.Contains(t, out, "canceled")
	_, err = run(t, ctx, "", "dlq", "task", "cancel", dlq, strconv.FormatInt(tasks[0].ID, 10))
	require.ErrorIs(t, err, messages.ErrRedriveTaskNotFound)
}
