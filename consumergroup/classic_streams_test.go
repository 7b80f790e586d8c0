package consumergroup

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// TestClassicGroupStreams: a group's streams are its classic members' subscriptions
// and the streams it has committed offsets (streamd groups) on, whichever protocol;
// an unknown group has none.
func TestClassicGroupStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c, _ := newClassic(t, pool)
	subscribed, committed, native := newStream(t, pool, 1), newStream(t, pool, 1), newStream(t, pool, 1)
	produceN(t, pool, committed, 0, 3)

	none, err := c.GroupStreams(ctx, testdb.Name("kg-none"))
	require.NoError(t, err)
	require.Empty(t, none)

	group := testdb.Name("kg")
	req := classicJoin(group, "", "")
	req.Topics = []string{subscribed}
	a, err := c.Join(ctx, req)
	require.NoError(t, err)
	got, err := c.GroupStreams(ctx, group)
	require.NoError(t, err)
	require.Equal(t, []string{subscribed}, got, "a member's subscription, before any commit")

	_, err = c.Sync(ctx, &ClassicSync{Group: group, MemberID: a.MemberID, Generation: a.Generation,
		Assignments: []ClassicAssignment{{MemberID: a.MemberID, Assignment: []byte("x")}}})
	require.NoError(t, err)
	_, err = c.CommitOffsets(ctx, &ClassicCommit{Group: group, MemberID: a.MemberID, Generation: a.Generation,
		Offsets: []StreamOffset{{Stream: committed, Partition: 0, Offset: 2}}})
	require.NoError(t, err)
	got, err = c.GroupStreams(ctx, group)
	require.NoError(t, err)
	want := []string{subscribed, committed}
	slices.Sort(want)
	require.Equal(t, want, got)

	nativeGroup := testdb.Name("kg-native")
	_, err = memberJoin(ctx, pool, native, nativeGroup, "native-1", "", testSession, testSession, nil)
	require.NoError(t, err)
	got, err = c.GroupStreams(ctx, nativeGroup)
	require.NoError(t, err)
	require.Equal(t, []string{native}, got)
}
