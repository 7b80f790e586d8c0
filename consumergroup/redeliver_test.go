package consumergroup

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// TestRedeliveryReachesALaterMemberInItsTransaction: a dead letter replayed while the
// group has no member waits for the partition's next owner, which gets it before its
// next fetch and marks it redelivered inside its own transaction (CommitTx), with its
// writes; only the partition's owner at its epoch may take or mark redeliveries.
func TestRedeliveryReachesALaterMemberInItsTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	table := testdb.Name("handled")
	_, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{table}.Sanitize()+" (event_id text, redelivered boolean)")
	require.NoError(t, err)
	pos := produce(t, pool, stream, 0, 3)
	poison := pos[1].Offset

	var healed atomic.Bool
	handler := func(ctx context.Context, b *Batch) error {
		for _, e := range b.Events {
			if e.Offset == poison && !b.Redelivered && !healed.Load() {
				return errors.New("poison")
			}
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		for _, e := range b.Events {
			if _, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{table}.Sanitize()+" VALUES ($1, $2)", e.EventID, b.Redelivered); err != nil {
				return err
			}
		}
		if err := b.CommitTx(ctx, tx); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	cfg := testConfig(stream, group)
	cfg.CommitMode = CommitTransactional
	cfg.OnHandlerError = ErrorDeadLetter
	cfg.MaxRetries = NoRetries
	c, err := New(pool, cfg)
	require.NoError(t, err)
	stop := runConsumer(t, c, handler)
	waitFor(t, 10*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })
	require.NoError(t, stop())

	admin := NewAdmin(pool)
	dl, err := admin.DeadLetters(ctx, stream, group, "pending")
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.NoError(t, admin.ReplayDeadLetter(ctx, stream, dl[0].ID, "ops"))

	// Nobody but the owner may take or mark it.
	_, err = pool.Exec(ctx, "SELECT * FROM streamd.redeliveries_take($1, $2, 'stranger', 1, 0, 10)", stream, group)
	require.ErrorIs(t, fenced(err, &member{stream: stream, group: group}, 0), ErrFenced)
	_, err = pool.Exec(ctx, "SELECT streamd.redeliveries_done($1, $2, 'stranger', 1, 0, $3)", stream, group, []int64{dl[0].ID})
	require.ErrorIs(t, fenced(err, &member{stream: stream, group: group}, 0), ErrFenced)

	c2, err := New(pool, cfg)
	require.NoError(t, err)
	runConsumer(t, c2, handler)
	waitFor(t, 10*time.Second, "redelivered", func() bool {
		got, err := admin.DeadLetters(ctx, stream, group, "replayed")
		require.NoError(t, err)
		return len(got) == 1 && got[0].RedeliveredAt != nil
	})
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()+" WHERE event_id = $1 AND redelivered",
		dl[0].EventID).Scan(&n))
	require.Equal(t, 1, n, "the handler's write and the mark committed together, once")
}
