package consumergroup

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// TestLagsAndExpireStaleMembers: Lags reports each partition of a group (committed or
// not) as log end minus committed offset; ExpireStaleMembers removes a member whose
// session expired, and only it, and counts it.
func TestLagsAndExpireStaleMembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 2)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 10)
	admin := NewAdmin(pool)

	live, stale := join(t, pool, stream, group, "live"), join(t, pool, stream, group, "stale")
	owned := settle(t, pool, []*member{live, stale})
	require.NoError(t, live.commit(ctx, pool, []PartitionOffset{{Partition: owned["live"][0], Offset: 0}}, nil))

	lags, err := admin.Lags(ctx)
	require.NoError(t, err)
	var mine []PartitionLag
	var total int64
	for _, l := range lags {
		if l.Stream == stream {
			mine = append(mine, l)
			total += l.Lag
		}
	}
	require.Len(t, mine, 2, "every partition of the group")
	require.Equal(t, group, mine[0].Group)
	require.Equal(t, []int32{0, 1}, []int32{mine[0].Partition, mine[1].Partition})
	require.EqualValues(t, 10, total, "nothing read yet: the whole log")

	_, err = pool.Exec(ctx, `UPDATE streamd.consumer_registrations SET last_heartbeat = now() - interval '1 hour'
		WHERE stream_name = $1 AND group_id = $2 AND consumer_id = 'stale'`, stream, group)
	require.NoError(t, err)
	n, err := admin.ExpireStaleMembers(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 1, "the stale member is expired (other tests' may be too)")
	d, err := admin.DescribeGroup(ctx, stream, group)
	require.NoError(t, err)
	require.Len(t, d.MemberStatus, 1)
	require.Equal(t, "live", d.MemberStatus[0].ConsumerID)
}

// TestResetOffsetsDryRun: a dry run returns the changes a reset would make and makes
// none; the same reset then makes exactly those.
func TestResetOffsetsDryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 10)
	admin := NewAdmin(pool)
	m := join(t, pool, stream, group, "a")
	_, err := m.heartbeat(ctx, pool, nil)
	require.NoError(t, err)
	require.NoError(t, m.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 5}}, nil))
	_, err = m.leave(ctx, pool, nil)
	require.NoError(t, err)

	preview, err := admin.ResetOffsets(ctx, stream, group, ResetOpts{Mode: ResetToOffset, Value: 2, DryRun: true})
	require.NoError(t, err)
	require.Len(t, preview, 1)
	require.EqualValues(t, 5, *preview[0].Previous)
	require.EqualValues(t, 2, preview[0].New)
	off, _, err := committedOffset(ctx, pool, stream, group, 0)
	require.NoError(t, err)
	require.EqualValues(t, 5, off, "a dry run changes nothing")

	done, err := admin.ResetOffsets(ctx, stream, group, ResetOpts{Mode: ResetToOffset, Value: 2})
	require.NoError(t, err)
	require.Equal(t, preview, done)
	off, _, err = committedOffset(ctx, pool, stream, group, 0)
	require.NoError(t, err)
	require.EqualValues(t, 2, off)
}
