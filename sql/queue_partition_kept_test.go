package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
)

// TestKeptPartitionRefusesRows: a queue's deletion that cannot drop its partition in
// 50 ms (another queue's transaction is open) keeps it, empty; a row of the deleted
// queue must still be refused with SD201 and nothing written (migration 0215: "a row
// of no queue ... raises SD201"), and a queue made again under the name starts empty
// and takes rows.
func TestKeptPartitionRefusesRows(t *testing.T) {
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
	conn, other := connect(), connect()
	_, err := schema.MigrateConn(ctx, conn)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT streamd.queue_create('x', false, 30000, 5, NULL, 262144);
		SELECT streamd.queue_create('y', false, 30000, 5, NULL, 262144)`)
	require.NoError(t, err)

	tx, err := other.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT * FROM streamd.queue_send('y', ARRAY['m'], ARRAY['{}'], NULL, NULL, NULL, NULL, NULL, NULL, NULL)`)
	require.NoError(t, err)
	var deleted bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT streamd.queue_delete('x')`).Scan(&deleted))
	require.True(t, deleted)
	require.NoError(t, tx.Commit(ctx))
	var kept bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass(format('streamd.%I', 'queue_messages_' || md5('x'))) IS NOT NULL`).Scan(&kept))
	require.True(t, kept, "the set-up: the partition is kept")

	const insert = `INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, enqueued_at, visibility_timeout)
		VALUES ('x', 1, 'ghost', '{}', now(), now())`
	_, err = conn.Exec(ctx, insert)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "a row of a deleted queue is refused")
	require.Equal(t, "SD201", pgErr.Code)

	_, err = conn.Exec(ctx, `SELECT streamd.queue_create('x', false, 30000, 5, NULL, 262144)`)
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_receive('x', 10, NULL, NULL)`).Scan(&n))
	require.Zero(t, n, "the queue made again starts empty")
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_send('x', ARRAY['m'], ARRAY['{}'],
		NULL, NULL, NULL, NULL, NULL, NULL, NULL)`).Scan(&n))
	require.Equal(t, 1, n)
}
