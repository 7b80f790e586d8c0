package consumergroup

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

func owned(res *ConsumerHeartbeatResult) []StreamPartition { return res.Assignment }

// TestKIP848MembersShareTheNativeGroup: KIP-848 members join the stream's native group
// and get the server-side sticky assignment incrementally: a partition moves only after
// its owner reports it no longer owns it; a commit of a revoked partition is
// STALE_MEMBER_EPOCH and one with another epoch FENCED_MEMBER_EPOCH, both writing
// nothing; a native Go member shares the group; a classic member cannot join it.
func TestKIP848MembersShareTheNativeGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, err := NewClassic(pool, &ClassicConfig{ConsumerSessionTimeout: 10 * time.Second})
	require.NoError(t, err)
	stream := newStream(t, pool, 4)
	produceN(t, pool, stream, 0, 5)
	group := testdb.Name("kg")

	a, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", Topics: []string{stream}})
	require.NoError(t, err)
	require.Positive(t, a.MemberEpoch)
	require.Len(t, owned(a), 4)

	b, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "b", Topics: []string{stream}})
	require.NoError(t, err)
	require.Empty(t, owned(b), "nothing moves before its owner let it go")

	// A is told to keep two; until it says it let the others go, it still owns them.
	a2, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", MemberEpoch: a.MemberEpoch})
	require.NoError(t, err)
	require.Len(t, owned(a2), 2)
	kept := map[int32]bool{}
	for _, p := range owned(a2) {
		kept[p.Partition] = true
	}
	var revoked int32 = -1
	for p := int32(0); p < 4; p++ {
		if !kept[p] {
			revoked = p
		}
	}
	res, err := c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: "a", Generation: a.MemberEpoch,
		Offsets: []StreamOffset{{Stream: stream, Partition: revoked, Offset: 0}}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err, "a revoking member commits before it lets go")

	_, err = c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", MemberEpoch: a.MemberEpoch,
		Owned: owned(a2), OwnedKnown: true})
	require.NoError(t, err)
	b2, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "b", MemberEpoch: b.MemberEpoch})
	require.NoError(t, err)
	require.Len(t, owned(b2), 2)

	produceN(t, pool, stream, revoked, 3)
	res, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: "a", Generation: a.MemberEpoch,
		Offsets: []StreamOffset{{Stream: stream, Partition: revoked, Offset: 2}}})
	require.NoError(t, err)
	require.ErrorIs(t, res[0].Err, ErrStaleMemberEpoch)
	res, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: "b", Generation: b.MemberEpoch + 7,
		Offsets: []StreamOffset{{Stream: stream, Partition: revoked, Offset: 2}}})
	require.NoError(t, err)
	require.ErrorIs(t, res[0].Err, ErrFenced)
	require.Equal(t, map[int32]int64{revoked: 0}, committed(t, c, group, stream), "refused commits wrote nothing")
	res, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: "b", Generation: b.MemberEpoch,
		Offsets: []StreamOffset{{Stream: stream, Partition: revoked, Offset: 2}}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)

	_, err = c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", MemberEpoch: a.MemberEpoch + 1})
	require.ErrorIs(t, err, ErrFenced)
	_, err = c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "nobody", MemberEpoch: 3})
	require.ErrorIs(t, err, ErrUnknownMember)
	_, err = c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "x", Topics: []string{stream, "other"}})
	require.ErrorIs(t, err, ErrInvalidArgument)

	// A native Go member joins the same group; a classic member cannot.
	native := join(t, pool, stream, group, "native-1")
	require.NotZero(t, native.epoch)
	_, err = c.Join(ctx, classicJoin(group, "", ""))
	require.ErrorIs(t, err, ErrInconsistentGroupProtocol)

	// A leaves: its partitions go to the others.
	left, err := c.ConsumerHeartbeat(ctx, &ConsumerHeartbeat{Group: group, MemberID: "a", MemberEpoch: -1})
	require.NoError(t, err)
	require.Equal(t, int32(-1), left.MemberEpoch)
	d, err := NewAdmin(pool).DescribeGroup(ctx, stream, group)
	require.NoError(t, err)
	require.Len(t, d.MemberStatus, 2)
}
