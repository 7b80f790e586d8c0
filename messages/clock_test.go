package messages_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// TestFIFOTimesCountFromAfterTheGroupLock (the clock rule, DESIGN.md): a FIFO
// extension, nack or send that waited for its group's row, which an open SendTx to the
// group holds (an outbox transaction), counts its lease or delay from when it got the
// row. It counted from the start of the call: an extension that waited longer than
// it extends returned a lease already over, and the message was delivered again.
func TestFIFOTimesCountFromAfterTheGroupLock(t *testing.T) {
	t.Parallel()
	const (
		d    = 500 * time.Millisecond // the lease or delay each call asks for
		wait = 700 * time.Millisecond // how long it waits for the group row, at least
	)
	for _, tc := range []struct {
		name string
		// call runs on conn, naming the leased message (offset, token), and returns
		// the offset whose visibility it set.
		call func(ctx context.Context, conn *pgxpool.Conn, q string, off int64, token [16]byte) (int64, error)
		// query is a part of call's statement, to find it waiting.
		query string
	}{
		{
			name: "extend", query: "queue_extend",
			call: func(ctx context.Context, conn *pgxpool.Conn, q string, off int64, token [16]byte) (int64, error) {
				_, err := conn.Exec(ctx, "SELECT * FROM streamd.queue_extend($1, $2, $3, $4, NULL)",
					q, []int64{off}, [][16]byte{token}, d.Milliseconds())
				return off, err
			},
		},
		{
			name: "nack", query: "queue_nack",
			call: func(ctx context.Context, conn *pgxpool.Conn, q string, off int64, token [16]byte) (int64, error) {
				_, err := conn.Exec(ctx, "SELECT * FROM streamd.queue_nack($1, $2, $3, $4, NULL, NULL)",
					q, []int64{off}, [][16]byte{token}, []int64{d.Milliseconds()})
				return off, err
			},
		},
		{
			name: "send", query: "queue_send",
			call: func(ctx context.Context, conn *pgxpool.Conn, q string, _ int64, _ [16]byte) (int64, error) {
				var sent int64
				err := conn.QueryRow(ctx, `SELECT "offset" FROM streamd.queue_send($1, NULL, ARRAY['1'], NULL, $2, NULL,
					ARRAY['g'], NULL, NULL, NULL)`, q, []int64{d.Milliseconds()}).Scan(&sent)
				return sent, err
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			c := newClient(t, pool, nil)
			q := newQueue(t, pool, &messages.QueueConfig{FIFO: true})
			_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: data(0), GroupKey: "g"})
			require.NoError(t, err)
			got, err := c.Receive(ctx, q, nil)
			require.NoError(t, err)
			require.Len(t, got, 1)
			var token [16]byte
			require.NoError(t, pool.QueryRow(ctx, `SELECT lease_token FROM streamd.messages WHERE stream_name = $1 AND "offset" = $2`,
				q, got[0].Offset).Scan(&token))

			// An outbox transaction sends to the group and stays open: it holds the
			// group's row.
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = c.SendTx(ctx, tx, q, messages.OutgoingMessage{Data: data(1), GroupKey: "g"})
			require.NoError(t, err)

			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			pid := conn.Conn().PgConn().PID()
			type result struct {
				off int64
				err error
			}
			done := make(chan result, 1)
			go func() {
				off, err := tc.call(ctx, conn, q, got[0].Offset, token)
				done <- result{off, err}
			}()
			testdb.WaitForLockWait(t, pool, tx, tc.query)
			for deadline := time.Now().Add(wait + 10*time.Second); ; {
				var long bool
				require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce((SELECT clock_timestamp() - query_start > $2::interval
					FROM pg_stat_activity WHERE pid = $1), false)`, int(pid), wait.String()).Scan(&long))
				if long {
					break
				}
				require.False(t, time.Now().After(deadline), "the call did not wait %v", wait)
				time.Sleep(10 * time.Millisecond) // polling interval
			}
			var released time.Time
			require.NoError(t, tx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&released))
			require.NoError(t, tx.Commit(ctx))
			r := <-done
			require.NoError(t, r.err)

			var visible time.Time
			require.NoError(t, pool.QueryRow(ctx, `SELECT visibility_timeout FROM streamd.messages WHERE stream_name = $1 AND "offset" = $2`,
				q, r.off).Scan(&visible))
			require.False(t, visible.Before(released.Add(d)),
				"visible again at %v: %v counted from before the wait (the group row was released at %v)", visible, d, released)
		})
	}
}
