package messages_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
	schema "github.com/streamd/streamd/sql"
)

// TestOffsetsArePerQueue: each queue numbers its messages from its own sequence
// (L5: no global counter; migration 0086), so sends to one queue leave no gaps in
// another's offsets. With the global sequence they shared, the second queue's first
// offset came after the first queue's.
func TestOffsetsArePerQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	a, b := newQueue(t, pool, nil), newQueue(t, pool, nil)
	offsets := func(q string, n int) []int64 {
		msgs := make([]messages.OutgoingMessage, n)
		for i := range msgs {
			msgs[i] = messages.OutgoingMessage{Data: data(i)}
		}
		res, err := c.Send(ctx, q, msgs...)
		require.NoError(t, err)
		out := make([]int64, n)
		for i, r := range res {
			out[i] = r.Offset
		}
		return out
	}
	require.Equal(t, []int64{1, 2, 3}, offsets(a, 3))
	require.Equal(t, []int64{1, 2}, offsets(b, 2), "b's offsets are its own")
	require.Equal(t, []int64{1 + 128}, offsets(a, 1), "a's next block of offsets (migration 0205)")

	// A queue made again after its deletion starts again; its sequence went with it.
	require.NoError(t, c.DeleteQueue(ctx, b))
	var seqs int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relkind = 'S'
		AND relnamespace = 'streamd'::regnamespace AND relname = 'queue_offsets_' || md5($1)`, b).Scan(&seqs))
	require.Zero(t, seqs, "the deleted queue's sequence is dropped")
	require.NoError(t, c.CreateQueue(ctx, b, nil))
	require.Equal(t, []int64{1}, offsets(b, 1))
}

// TestQueueSettingsApplyToQueuedMessages: a message stores its max delivery attempts
// and dead-letter queue only when its sender gave them (migration 0086); otherwise the
// queue's settings at the time of the delivery apply, so a dead-letter policy set
// after the send catches the messages already queued, and a message sent with its
// own keeps it.
func TestQueueSettingsApplyToQueuedMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{MaxDeliveryAttempts: 5})
	dlq := newQueue(t, pool, nil)
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("queue's"), MessageID: "queue's"},
		messages.OutgoingMessage{Data: data("own"), MessageID: "own", MaxDeliveryAttempts: 3})
	require.NoError(t, err)
	var stored []*int32
	rows, err := pool.Query(ctx, `SELECT max_delivery_attempts FROM streamd.queue_messages WHERE stream_name = $1 ORDER BY "offset"`, q)
	require.NoError(t, err)
	for rows.Next() {
		var v *int32
		require.NoError(t, rows.Scan(&v))
		stored = append(stored, v)
	}
	require.NoError(t, rows.Err())
	require.Len(t, stored, 2)
	require.Nil(t, stored[0], "the queue's setting is not copied into the row")
	require.Equal(t, int32(3), *stored[1])

	require.NoError(t, c.CreateQueue(ctx, q, &messages.QueueConfig{MaxDeliveryAttempts: 1, DeadLetterQueue: dlq,
		VisibilityTimeout: 30 * time.Second}))
	got, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 2})
	require.NoError(t, err)
	require.Len(t, got, 2)
	for _, m := range got {
		want := map[string]int{"queue's": 1, "own": 3}[m.MessageID]
		require.Equal(t, want, m.MaxDeliveryAttempts, m.MessageID)
	}
	require.NoError(t, c.Nack(ctx, nil, got[0].Receipt, got[1].Receipt))
	var inDLQ []string
	rows, err = pool.Query(ctx, `SELECT message_id FROM streamd.messages WHERE stream_name = $1`, dlq)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		inDLQ = append(inDLQ, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"queue's"}, inDLQ, "the new policy dead-letters the queued message; the other has attempts left")
	require.Equal(t, 1, count(t, pool, q))
}

// TestReceiveDoesNotReadPastDelayedMessages: messages sent with a delay go to the
// queue's delayed lane (migration 0099: offsets after every undelayed message's), so a
// receive of ready messages does not read past them, and finds them through their
// own index once they are due. Before, a receive read every delayed message at the
// queue's head (BenchmarkQueueDelayedHead: 7x the time per batch behind 100,000).
// pg_stat_xact_user_tables counts the rows the transaction read.
func TestReceiveDoesNotReadPastDelayedMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q := setup(t, clock, nil)
	later := make([]messages.OutgoingMessage, 2000)
	for i := range later {
		later[i] = messages.OutgoingMessage{Data: data(i), Delay: time.Duration(i+1) * time.Second}
	}
	res, err := c.Send(ctx, q, later...)
	require.NoError(t, err)
	ready, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("ready")})
	require.NoError(t, err)

	var n int
	var rows int64
	require.NoError(t, pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error {
		got, err := tx.Query(ctx, `SELECT "offset" FROM streamd.queue_receive($1, 10, NULL, $2)`, q, clock.Now())
		require.NoError(t, err)
		for got.Next() {
			n++
		}
		require.NoError(t, got.Err())
		return tx.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
			FROM pg_stat_xact_user_tables WHERE relid = 'streamd.queue_messages'::regclass`).Scan(&rows)
	}))
	require.Equal(t, 1, n, "only the ready message is visible")
	require.Less(t, rows, int64(100), "the receive read %d rows behind 2,000 delayed messages", rows)
	require.Greater(t, res[0].Offset, ready[0].Offset, "a delayed message's offset is after the undelayed ones'")

	// Once due, they are received (the ready one is in flight).
	clock.Advance(3 * time.Second)
	got, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 10})
	require.NoError(t, err)
	var order []string
	for _, m := range got {
		order = append(order, string(m.Data))
	}
	require.ElementsMatch(t, []string{"0", "1", "2"}, order)
}

// TestLeaseUpdatesAreHOT: a receive's lease, an extension and a nack change no
// indexed column, so they are HOT updates (no new index entries, nothing dead for the
// next receive's scan of the primary key to read past), a message of the delayed lane
// included. Migration 0099 indexed the lane by visibility_timeout, and a partial index
// blocks HOT for every row (PostgreSQL decides by column): no update of any message
// was HOT until migration 0120 indexed the lane by due_at, which nothing updates.
// pg_stat_xact_user_tables counts the transaction's own updates.
func TestLeaseUpdatesAreHOT(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newFakeClock()
	c, q := setup(t, clock, nil)
	_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data("later"), Delay: time.Second})
	require.NoError(t, err)
	for i := range 10 {
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(i)})
		require.NoError(t, err)
	}
	clock.Advance(2 * time.Second)

	var upd, hot int64
	require.NoError(t, pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT "offset", lease_token FROM streamd.queue_receive($1, 20, NULL, $2)`, q, clock.Now())
		require.NoError(t, err)
		var offs []int64
		var toks [][16]byte
		for rows.Next() {
			var o int64
			var tok [16]byte
			require.NoError(t, rows.Scan(&o, &tok))
			offs, toks = append(offs, o), append(toks, tok)
		}
		require.NoError(t, rows.Err())
		require.Len(t, offs, 11, "the ten ready messages and the due one of the lane")
		_, err = tx.Exec(ctx, `SELECT * FROM streamd.queue_extend($1, $2, $3, 60000, $4)`, q, offs[:5], toks[:5], clock.Now())
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT * FROM streamd.queue_nack($1, $2, $3, NULL, NULL, $4)`, q, offs[5:], toks[5:], clock.Now())
		require.NoError(t, err)
		// The queue's updates are counted on its partition (migration 0215).
		return tx.QueryRow(ctx, `SELECT coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_hot_upd), 0)::bigint
			FROM pg_stat_xact_user_tables
			WHERE relid IN (SELECT p.relid FROM pg_partition_tree('streamd.queue_messages') p)`).Scan(&upd, &hot)
	}))
	require.Equal(t, int64(11+5+6), upd)
	// A HOT update needs room on its row's page (fillfactor 50 leaves half of each
	// page for them), which the other tests' updates of rows on the same pages use
	// too: most, not all, is what can be asserted. An indexed column blocks them all.
	require.GreaterOrEqual(t, 2*hot, upd, "%d of the %d lease updates were not HOT", upd-hot, upd)
}

// TestFIFOGroupStatementsReadOnlyTheirGroups: a FIFO receive and an ack of 100
// messages read about 100 group rows each, however many groups the queue has. Joined
// to message_groups, the planner scanned every group of the queue once per group of
// the batch whenever its statistics said a queue has a handful of groups (as they say
// after an ANALYZE of many small queues): 100 x 1,000 rows here, 26 ms for a receive of
// 100 in a queue of 100 groups (bench/RESULTS.md, session 10). With statistics of
// few groups in a few queues (10 queues of 3 groups analyzed: the most common queue's
// share, a tenth, caps the planner's share of a queue) over the empty pages a drained
// queue leaves, the ack's group lock scanned the queue's groups once and compared each
// with every receipt's group: 1,000 rows and 100,000 comparisons, 32–107 ms per ack of
// 100 (bench/RESULTS.md, "Issue 22, session 15 (fifo15)"). A database of its own per
// case, to set those statistics; pg_stat_xact_user_tables counts the transaction's
// own index fetches. A discard of messages not in flight locks their groups as the
// settlements do, and read the queue's 1,000 group rows for 100 messages the same way.
func TestFIFOGroupStatementsReadOnlyTheirGroups(t *testing.T) {
	t.Parallel()
	for _, small := range []struct{ queues, groups int }{{50, 1}, {10, 3}} {
		t.Run(fmt.Sprintf("%dx%d_groups_analyzed", small.queues, small.groups), func(t *testing.T) {
			t.Parallel()
			fifoGroupStatementsReadOnlyTheirGroups(t, small.queues, small.groups)
		})
	}
}

func fifoGroupStatementsReadOnlyTheirGroups(t *testing.T, smallQueues, smallGroups int) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.FreshDatabase(t))
	require.NoError(t, err)
	defer pool.Close()
	_, err = schema.Migrate(ctx, pool)
	require.NoError(t, err)
	c, err := messages.NewClient(pool, nil)
	require.NoError(t, err)
	const q, groups, batch = "big", 1000, 100
	send := func(q string) {
		for k := range groups / batch {
			msgs := make([]messages.OutgoingMessage, batch)
			for i := range msgs {
				msgs[i] = messages.OutgoingMessage{Data: data(i), GroupKey: fmt.Sprintf("g%d", k*batch+i)}
			}
			_, err := c.Send(ctx, q, msgs...)
			require.NoError(t, err)
		}
	}
	// The table's pages as a drained queue leaves them: empty, kept (VACUUM does not
	// truncate them here; in a busy database the next groups fill them), so the
	// planner's estimate of the rows stays that of the analyzed rows.
	require.NoError(t, c.CreateQueue(ctx, "drained", &messages.QueueConfig{FIFO: true}))
	send("drained")
	// On a connection of its own: a backend's statistics of its earlier
	// transactions show in pg_stat_xact_user_tables until they are flushed.
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT streamd.queue_purge('drained')")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	for i := range smallQueues { // small queues, analyzed
		q := fmt.Sprintf("small%d", i)
		require.NoError(t, c.CreateQueue(ctx, q, &messages.QueueConfig{FIFO: true}))
		for g := range smallGroups {
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(i), GroupKey: fmt.Sprintf("g%d", g)})
			require.NoError(t, err)
		}
	}
	_, err = pool.Exec(ctx, "VACUUM (ANALYZE, TRUNCATE false) streamd.message_groups")
	require.NoError(t, err)

	require.NoError(t, c.CreateQueue(ctx, q, &messages.QueueConfig{FIFO: true}))
	send(q)
	groupFetches := func(tx pgx.Tx) int64 {
		var n int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
			WHERE relid = 'streamd.message_groups'::regclass`).Scan(&n))
		return n
	}
	var offs []int64
	var toks [][16]byte
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		offs, toks = receiveLeases(t, tx, q, batch)
		require.Len(t, offs, batch)
		n := groupFetches(tx)
		require.Less(t, n, int64(5*batch), "a receive of %d read %d group rows of %d", batch, n, groups)
		return nil
	}))
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var stale int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM unnest($2::bigint[]) o
			WHERE o NOT IN (SELECT "offset" FROM streamd.queue_ack($1, $2, $3, NULL))`, q, offs, toks).Scan(&stale))
		require.Zero(t, stale)
		n := groupFetches(tx)
		require.Less(t, n, int64(5*batch), "an ack of %d read %d group rows of %d", batch, n, groups)
		return nil
	}))
	// The other settlements lock their groups through queue_lock_groups.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		offs, toks = receiveLeases(t, tx, q, batch)
		require.Len(t, offs, batch)
		return nil
	}))
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		before := groupFetches(tx)
		var settled int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_nack($1, $2, $3, NULL, NULL, NULL)`,
			q, offs, toks).Scan(&settled))
		require.Equal(t, batch, settled)
		n := groupFetches(tx) - before
		require.Less(t, n, int64(5*batch), "a nack of %d read %d group rows of %d", batch, n, groups)
		return nil
	}))
	// A discard (of messages not in flight) locks their groups too.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		before := groupFetches(tx)
		var discarded int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_discard($1, $2, NULL)`,
			q, offs).Scan(&discarded))
		require.Equal(t, batch, discarded)
		n := groupFetches(tx) - before
		require.Less(t, n, int64(5*batch), "a discard of %d read %d group rows of %d", batch, n, groups)
		return nil
	}))
}

// TestFIFOGroupRowsWrittenOnlyWhenTheyChange: a FIFO queue writes a group row on top of
// each message (issue 22's FIFO target). A send to a group that already holds
// messages locks its row and leaves it as it is (the upsert rewrote it unchanged: a
// row version per group per send); a receive and an ack write each group they move
// once, by the ctid of the row they locked, with no second lookup of its key (a
// lookup read every dead version of the key too), and the receive's writes are HOT
// (migration 0195: they change no indexed column).
// pg_stat_xact_user_tables counts the transaction's own writes and index fetches.
func TestFIFOGroupRowsWrittenOnlyWhenTheyChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{FIFO: true})
	const groups = 100
	batch := func(k int) []messages.OutgoingMessage {
		msgs := make([]messages.OutgoingMessage, groups)
		for i := range msgs {
			msgs[i] = messages.OutgoingMessage{Data: data(k*groups + i), GroupKey: fmt.Sprintf("g%d", i)}
		}
		return msgs
	}
	_, err := c.Send(ctx, q, batch(0)...)
	require.NoError(t, err)
	var second []messages.SendResult // the second batch: message i is group i
	// Each step on a connection of its own: the counts of a backend's earlier
	// transactions stay in its pending statistics (and in pg_stat_xact_user_tables)
	// until they are flushed, up to a second later.
	inFreshTx := func(f func(tx pgx.Tx) error) error {
		conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
		require.NoError(t, err)
		defer func() { _ = conn.Close(ctx) }()
		return pgx.BeginFunc(ctx, conn, f)
	}
	type counts struct{ upd, hot, del, fetch int64 }
	groupWrites := func(tx pgx.Tx) counts {
		var n counts
		require.NoError(t, tx.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd, n_tup_del, coalesce(idx_tup_fetch, 0)
			FROM pg_stat_xact_user_tables WHERE relid = 'streamd.message_groups'::regclass`).Scan(&n.upd, &n.hot, &n.del, &n.fetch))
		return n
	}

	require.NoError(t, inFreshTx(func(tx pgx.Tx) error {
		second, err = c.SendTx(ctx, tx, q, batch(1)...)
		require.NoError(t, err)
		// (n_tup_ins counts the upsert's attempts, whether it inserted or not.)
		n := groupWrites(tx)
		require.Zero(t, n.upd+n.del, "a send to %d groups that hold messages wrote their rows: %+v", groups, n)
		return nil
	}))

	var offs []int64
	var toks [][16]byte
	require.NoError(t, inFreshTx(func(tx pgx.Tx) error {
		offs, toks = receiveLeases(t, tx, q, groups)
		require.Len(t, offs, groups)
		n := groupWrites(tx)
		require.Equal(t, int64(groups), n.upd, "%+v", n)
		// HOT: the lease's end goes to lease_end, in no index (migration 0195). A
		// version that finds no room on its page is not HOT; fillfactor 50 leaves
		// room for all of them here.
		require.GreaterOrEqual(t, n.hot, int64(groups*9/10), "a receive's group writes are HOT: %+v", n)
		require.LessOrEqual(t, n.fetch, int64(groups+groups/10), "a receive of %d groups fetched %d group rows", groups, n.fetch)
		return nil
	}))
	require.NoError(t, inFreshTx(func(tx pgx.Tx) error {
		var settled int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM streamd.queue_ack($1, $2, $3, NULL)`, q, offs, toks).Scan(&settled))
		require.Equal(t, groups, settled)
		n := groupWrites(tx)
		require.Equal(t, int64(groups), n.upd, "each group holds its second message: %+v", n)
		require.LessOrEqual(t, n.fetch, int64(groups+groups/10), "an ack of %d groups fetched %d group rows", groups, n.fetch)
		return nil
	}))
	got, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 2 * groups})
	require.NoError(t, err)
	require.Len(t, got, groups, "each group's second message, one per group")
	rs := make([]messages.Receipt, len(got))
	for i, m := range got {
		require.Equal(t, fmt.Sprintf("g%d", m.Offset-second[0].Offset), m.GroupKey, "offset %d", m.Offset)
		rs[i] = m.Receipt
	}
	require.NoError(t, c.Ack(ctx, rs...))
	var left int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.message_groups WHERE stream_name = $1", q).Scan(&left))
	require.Zero(t, left, "an empty group's row goes")
}

// receiveLeases receives up to max messages of q with streamd.queue_receive in tx
// and returns their offsets and lease tokens.
func receiveLeases(t *testing.T, tx pgx.Tx, q string, max int) (offs []int64, toks [][16]byte) {
	t.Helper()
	rows, err := tx.Query(context.Background(), `SELECT "offset", lease_token FROM streamd.queue_receive($1, $2, NULL, NULL)`, q, max)
	require.NoError(t, err)
	for rows.Next() {
		var o int64
		var tok [16]byte
		require.NoError(t, rows.Scan(&o, &tok))
		offs, toks = append(offs, o), append(toks, tok)
	}
	require.NoError(t, rows.Err())
	return offs, toks
}
