package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
)

// TestQueueCreationHoldsUpNoOtherQueue: a queue's creation attaches its partition,
// which needs the default partition's ACCESS EXCLUSIVE lock; a statement that reads
// every partition (queue_stats counts a queue's dead letters in all of them) holds a
// lock of the default partition until its transaction ends. While such a transaction
// is open, the creation may wait, but a statement of another queue that reads every
// partition (queue_stats of that queue) must not wait behind the creation
// (docs/operations.md, migration 0215: "other queues' traffic goes on").
func TestQueueCreationHoldsUpNoOtherQueue(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := testdb.FreshDatabase(t)
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	reader, creator, other := connect(), connect(), connect()
	_, err := schema.MigrateConn(ctx, reader)
	require.NoError(t, err)
	_, err = reader.Exec(ctx, `SELECT streamd.queue_create('a', false, 30000, 5, NULL, 262144);
		SELECT streamd.queue_create('b', false, 30000, 5, NULL, 262144)`)
	require.NoError(t, err)

	tx, err := reader.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT * FROM streamd.queue_stats('a', NULL)`)
	require.NoError(t, err)

	var creatorPID uint32 = creator.PgConn().PID()
	created := make(chan error, 1)
	go func() {
		_, err := creator.Exec(ctx, `SELECT streamd.queue_create('c', false, 30000, 5, NULL, 262144)`)
		created <- err
	}()
	// Wait until the creation waits for a lock (or between its tries).
	require.Eventually(t, func() bool {
		var waiting bool
		err := other.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1
			AND state = 'active' AND wait_event_type IN ('Lock', 'Timeout'))`, creatorPID).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 10*time.Millisecond)

	statsCtx, statsCancel := context.WithTimeout(ctx, 2*time.Second)
	defer statsCancel()
	var total int64
	err = other.QueryRow(statsCtx, `SELECT total FROM streamd.queue_stats('b', NULL)`).Scan(&total)
	require.NoError(t, err, "queue_stats of another queue waited behind the creation")

	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-created)
}
