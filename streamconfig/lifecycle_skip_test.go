package streamconfig_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/streamconfig"
)

// TestApplyLifecycleSkipsAnUnparseableValue: a lifecycle_config stored before its keys
// were checked (an upgrade; written here with the table's triggers off, as a restore
// or an old version would) that does not parse is skipped, and the other streams'
// lifecycle still applies; the pass does not fail.
func TestApplyLifecycleSkipsAnUnparseableValue(t *testing.T) {
	// Not parallel: a pass applies every stream's lifecycle, so two tests' passes at
	// a later time archive and delete each other's streams (TestApplyLifecycle and
	// TestApplyLifecycleSkipsAnUnparseableValue each failed so, 5 runs in 40).
	ctx := context.Background()
	store, c, good := setup(t)
	_, _, bad := setup(t)
	minute := streamconfig.Duration(time.Minute)
	require.NoError(t, store.Set(ctx, good, &streamconfig.Config{Lifecycle: &streamconfig.Lifecycle{ArchiveAfter: &minute}}))
	conn, err := c.Pool().Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL session_replication_role = replica") // the triggers that check it are off
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO streamd.stream_configurations (stream_name, lifecycle_config)
		VALUES ($1, '{"archiveAfter": "soon", "deleteAfter": "00:00:01"}')`, bad)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	res, err := streamconfig.ApplyLifecycle(ctx, c.Pool(), time.Now().Add(2*time.Minute))
	require.NoError(t, err, "one bad configuration does not fail the pass")
	require.Contains(t, res.Archived, good, "the others' lifecycle applies")
	require.NotContains(t, res.Archived, bad)
	require.NotContains(t, res.Deleted, bad, "skipped, not deleted on half a configuration")
	_, err = c.DescribeStream(ctx, bad)
	require.NoError(t, err)
}
