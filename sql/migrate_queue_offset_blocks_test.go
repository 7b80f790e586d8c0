package schema_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	schema "github.com/streamd/streamd/sql"
)

// TestMigration0205KeepsTheQueuesMessages: migration 0205 makes every queue's
// sequence count in steps of 128 (a block of offsets per nextval). On a database at
// the schema before it, with a standard queue holding a message in flight, a ready
// one and a delayed (lane) one, and its dead-letter queue holding a dead letter,
// every message is still there afterwards with its offset; later sends take offsets
// above every held one in each range, consecutive within the batch, and a plain
// INSERT after a batch takes an offset above it; the lease taken before the migration
// acks with its token.
func TestMigration0205KeepsTheQueuesMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connectBefore(t, 205)

	_, err := conn.Exec(ctx, `
		CREATE SEQUENCE streamd.seq_s AS bigint MINVALUE 1 START 1;
		CREATE SEQUENCE streamd.seq_dlq AS bigint MINVALUE 1 START 1;
		SELECT setval('streamd.seq_s', 3), setval('streamd.seq_dlq', 7);
		INSERT INTO streamd.queues (queue_name, max_delivery_attempts, offset_seq) VALUES ('dlq', 5, 'streamd.seq_dlq');
		INSERT INTO streamd.queues (queue_name, max_delivery_attempts, dead_letter_queue, offset_seq)
			VALUES ('s', 5, 'dlq', 'streamd.seq_s');
		INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, enqueued_at, visibility_timeout,
		                                    delivery_attempts, lease_token, due_at) VALUES
			('s', 1, 'leased', '{}', now() - interval '5 min', now() + interval '1 hour', 1,
			 '00000000-0000-0000-0000-000000000001', NULL),
			('s', 2, 'ready', '{}', now() - interval '5 min', now() - interval '5 min', 0, NULL, NULL),
			('s', 4503599627370496 + 3, 'delayed', '{}', now() - interval '5 min', now() + interval '1 hour', 0, NULL,
			 now() + interval '1 hour');
		INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, enqueued_at, visibility_timeout,
		                                    delivery_attempts, origin_stream, origin_offset, origin_attempts, dead_lettered_at)
			VALUES ('dlq', 7, 'dead', '{}', now() - interval '5 min', now() - interval '5 min', 0, 's', 0, 5, now());`)
	require.NoError(t, err)

	_, err = schema.MigrateConn(ctx, conn)
	require.NoError(t, err)

	offsets := func(q string) []int64 {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT "offset" FROM streamd.queue_messages WHERE stream_name = $1 ORDER BY "offset"`, q)
		require.NoError(t, err)
		offs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return offs
	}
	const lane = 4503599627370496
	require.Equal(t, []int64{1, 2, lane + 3}, offsets("s"), "the queue's messages kept, in flight, ready and delayed")
	require.Equal(t, []int64{7}, offsets("dlq"), "the dead letter kept")

	send := func(q string, n int, delayMs *int64) []int64 {
		t.Helper()
		data := make([]string, n)
		var delays []*int64
		for i := range data {
			data[i] = `{}`
			delays = append(delays, delayMs)
		}
		if delayMs == nil {
			delays = nil
		}
		rows, err := conn.Query(ctx, `SELECT "offset" FROM streamd.queue_send($1, NULL, $2, NULL, $3, NULL, NULL, NULL, NULL, NULL)
			ORDER BY ord`, q, data, delays)
		require.NoError(t, err)
		offs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return offs
	}
	got := send("s", 3, nil)
	require.Greater(t, got[0], int64(3), "a later send's offsets are above the held ones")
	require.Equal(t, []int64{got[0], got[0] + 1, got[0] + 2}, got, "consecutive in the batch")
	// A plain INSERT takes one nextval: its block starts after the batch's. (With the
	// sequence still counting in ones it took the batch's second offset.)
	var plain int64
	require.NoError(t, conn.QueryRow(ctx, `INSERT INTO streamd.messages (stream_name, message_id, data)
		VALUES ('s', 'plain', '{}') RETURNING "offset"`).Scan(&plain))
	require.Greater(t, plain, got[2])
	hour := int64(3_600_000)
	delayed := send("s", 2, &hour)
	require.Greater(t, delayed[0], int64(lane+3), "a later delayed send's offsets are above the held lane's")
	require.Equal(t, []int64{delayed[0], delayed[0] + 1}, delayed)
	require.Greater(t, send("dlq", 1, nil)[0], int64(7))

	var acked int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_ack('s', ARRAY[1]::bigint[],
		ARRAY['00000000-0000-0000-0000-000000000001']::uuid[], NULL)`).Scan(&acked))
	require.Equal(t, 1, acked, "the lease taken before the migration settles")
	rows, err := conn.Query(ctx, `SELECT message_id FROM streamd.queue_receive('s', 10, NULL, NULL) ORDER BY "offset"`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, ids, 5, "the ready message and the four sent after the migration: %v", ids)
	require.Equal(t, "ready", ids[0])
}

// TestMigration0205TakesAQueueMadeWhileItRuns: a queue made while migration 0205 runs
// (by a server on the old functions, whose trigger made its sequence counting in
// ones; here the sequence is named) and committed before the migration does gets
// the steps of 128 too: its sends' blocks do not overlap (with a sequence counting in
// ones a send of 2 took offsets 1 and 2, and the next send 2 and 3: a duplicate key).
func TestMigration0205TakesAQueueMadeWhileItRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connectBefore(t, 205)
	pool, err := pgxpool.New(ctx, conn.Config().ConnString())
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	maker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = maker.Rollback(context.Background()) }()
	_, err = maker.Exec(ctx, `
		CREATE SEQUENCE streamd.seq_late AS bigint MINVALUE 1 START 1;
		INSERT INTO streamd.queues (queue_name, max_delivery_attempts, offset_seq) VALUES ('late', 5, 'streamd.seq_late')`)
	require.NoError(t, err)
	migrated := make(chan error, 1)
	go func() {
		_, err := schema.MigrateConn(ctx, conn)
		migrated <- err
	}()
	// The migration waits for the queue's INSERT (a statement of a migration or
	// function file: pg_stat_activity shows its first KiB, a comment).
	testdb.WaitForLockWait(t, pool, maker, "--")
	require.NoError(t, maker.Commit(ctx))
	require.NoError(t, <-migrated)

	send := func() []int64 {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT "offset" FROM streamd.queue_send('late', NULL, ARRAY['{}', '{}'], NULL, NULL,
			NULL, NULL, NULL, NULL, NULL) ORDER BY ord`)
		require.NoError(t, err)
		offs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return offs
	}
	first := send()
	second := send()
	require.Greater(t, second[0], first[1], "the second send's block above the first's: %v then %v", first, second)
}
