package consumergroup

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// backendPID returns the server process id of tx's connection.
func backendPID(t *testing.T, tx pgx.Tx) uint32 {
	t.Helper()
	var pid uint32
	require.NoError(t, tx.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
	return pid
}

// waitBlockedBy is testdb.WaitBlockedBy.
func waitBlockedBy(t *testing.T, pool *pgxpool.Pool, pid, blocker uint32, what string) {
	t.Helper()
	testdb.WaitBlockedBy(t, pool, pid, blocker, what)
}

// TestCommitBatchOnceWhenAttemptsOverlap (G4): two attempts of one batch whose
// transactions overlap, as when the first attempt's COMMIT is still in flight on the
// server while the client gave up and the worker retried. The fence's lock is shared,
// so both pass it; the second must then wait for the first one's offset row and, once
// the first committed, be refused with ErrAlreadyCommitted (else the handler's writes
// would commit twice). Both for a partition's first commit (no offset row yet: the two
// meet in the unique index) and a later one. When the first attempt rolls back, the
// second commits the batch.
func TestCommitBatchOnceWhenAttemptsOverlap(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		from, next  int64 // the batch; a later batch has [0, from) committed before
		firstCommit bool
	}{
		{"first commit of the partition, first attempt commits", 0, 3, true},
		{"later batch, first attempt commits", 3, 5, true},
		{"first commit of the partition, first attempt rolls back", 0, 3, false},
		{"later batch, first attempt rolls back", 3, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			stream := newStream(t, pool, 1)
			group := testdb.Name("g")
			produce(t, pool, stream, 0, 5)
			m := join(t, pool, stream, group, "a")
			_, err := m.heartbeat(ctx, pool, nil)
			require.NoError(t, err)
			if tc.from > 0 {
				require.NoError(t, m.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: tc.from}}, nil))
			}

			tx1, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx1.Rollback(ctx) }()
			require.NoError(t, m.commitBatch(ctx, tx1, 0, tc.from, tc.next, nil))

			tx2, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx2.Rollback(ctx) }()
			pid1, pid2 := backendPID(t, tx1), backendPID(t, tx2)
			second := make(chan error, 1)
			go func() { second <- m.commitBatch(ctx, tx2, 0, tc.from, tc.next, nil) }()
			waitBlockedBy(t, pool, pid2, pid1, "the second attempt waits for the first")

			if tc.firstCommit {
				require.NoError(t, tx1.Commit(ctx))
				require.ErrorIs(t, <-second, ErrAlreadyCommitted, "the second attempt of [%d, %d) is refused", tc.from, tc.next)
			} else {
				require.NoError(t, tx1.Rollback(ctx))
				require.NoError(t, <-second, "the first attempt rolled back: the second commits the batch")
				require.NoError(t, tx2.Commit(ctx))
			}
			off, ok, err := committedOffset(ctx, pool, stream, group, 0)
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, tc.next, off)
		})
	}
}
