package consumergroup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// TestFencedErrorSaysWhy: a fenced call's error is a *FencedError whose Reason tells
// the member's own expired session from a partition moved to another member and from
// a stale epoch, and it still matches ErrFenced. A member past its session used to get
// "does not own partition N", as if only the partition had moved.
func TestFencedErrorSaysWhy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 2)
	group := testdb.Name("g")
	a := join(t, pool, stream, group, "a")
	b := join(t, pool, stream, group, "b")
	owned := settle(t, pool, []*member{a, b})
	pa, pb := owned["a"][0], owned["b"][0]
	later := time.Now().Add(testSession * 2)

	for name, tc := range map[string]struct {
		call      func() error
		reason    FenceReason
		partition int32
		member    *member
	}{
		"commit of a partition that moved": {
			call:   func() error { return a.commit(ctx, pool, []PartitionOffset{{Partition: pb, Offset: 0}}, nil) },
			reason: FencePartitionMoved, partition: pb, member: a,
		},
		"CommitTx of a partition that moved": {
			call: func() error {
				tx, err := pool.Begin(ctx)
				require.NoError(t, err)
				defer func() { _ = tx.Rollback(ctx) }()
				return a.commitBatch(ctx, tx, pb, 0, 0, nil)
			},
			reason: FencePartitionMoved, partition: pb, member: a,
		},
		"commit past the session timeout": {
			call:   func() error { return a.commit(ctx, pool, []PartitionOffset{{Partition: pa, Offset: 0}}, &later) },
			reason: FenceSessionExpired, partition: pa, member: a,
		},
		"heartbeat past the session timeout": {
			call:   func() error { _, err := a.heartbeat(ctx, pool, &later); return err },
			reason: FenceSessionExpired, partition: -1, member: a,
		},
		"commit at a stale epoch": {
			call: func() error {
				old := &member{stream: stream, group: group, consumerID: "a", epoch: a.epoch - 1}
				return old.commit(ctx, pool, []PartitionOffset{{Partition: pa, Offset: 0}}, nil)
			},
			reason: FenceStaleEpoch, partition: pa, member: &member{consumerID: "a", epoch: a.epoch - 1},
		},
		"release by a member that is gone": {
			call: func() error {
				gone := &member{stream: stream, group: group, consumerID: "x", epoch: a.epoch}
				return gone.release(ctx, pool, []int32{pa}, nil)
			},
			reason: FenceSessionExpired, partition: -1, member: &member{consumerID: "x", epoch: a.epoch},
		},
	} {
		err := tc.call()
		require.ErrorIs(t, err, ErrFenced, name)
		var fe *FencedError
		require.True(t, errors.As(err, &fe), "%s: %T %v", name, err, err)
		require.Equal(t, tc.reason, fe.Reason, "%s: %v", name, err)
		require.Equal(t, tc.partition, fe.Partition, name)
		require.Equal(t, tc.member.consumerID, fe.MemberID, name)
		require.Equal(t, tc.member.epoch, fe.MemberEpoch, name)
		require.Contains(t, err.Error(), tc.reason.String(), name)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), name)
	}
	// None of them wrote anything.
	for _, p := range []int32{pa, pb} {
		_, ok, err := committedOffset(ctx, pool, stream, group, p)
		require.NoError(t, err)
		require.False(t, ok)
	}
}
