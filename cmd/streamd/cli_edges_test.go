package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
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
	cons, err := consumergroup.New(sc.Pool(), consumergroup.Config{Stream: stream, Group: group, SessionTimeout: 5 * time.Second})
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

	out, err := run(t, ctx, "", "-o", "json", "groups", "reset-offsets", group, "--stream", stream, "--to-earliest")
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
