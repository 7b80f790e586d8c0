package consumergroup

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// TestExportAndSetOffsets: ExportOffsets lists the committed offsets SetOffsets takes
// back; SetOffsets previews with DryRun, clamps to the log, is all or nothing (a bad
// partition or a repeated one writes nothing), and is refused while the group has a
// live member unless forced, which fences the member.
func TestExportAndSetOffsets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	s1, s2 := newStream(t, pool, 2), newStream(t, pool, 1)
	group := testdb.Name("g")
	produceN(t, pool, s1, 0, 10)
	produceN(t, pool, s1, 1, 10)
	produceN(t, pool, s2, 0, 10)
	admin := NewAdmin(pool)

	_, err := admin.ExportOffsets(ctx, "", group)
	require.ErrorIs(t, err, ErrGroupNotFound)
	_, err = admin.SetOffsets(ctx, group, []GroupOffset{{Stream: s1, Partition: 0, Offset: 1}}, nil)
	require.ErrorIs(t, err, ErrGroupNotFound)

	m1, m2 := join(t, pool, s1, group, "a"), join(t, pool, s2, group, "b")
	for _, m := range []*member{m1, m2} {
		_, err = m.heartbeat(ctx, pool, nil)
		require.NoError(t, err)
	}
	require.NoError(t, m1.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 3}}, nil))
	require.NoError(t, m2.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 4}}, nil))

	all, err := admin.ExportOffsets(ctx, "", group)
	require.NoError(t, err)
	want := []GroupOffset{{Stream: s1, Partition: 0, Offset: 3}, {Stream: s2, Partition: 0, Offset: 4}}
	if s2 < s1 {
		want[0], want[1] = want[1], want[0]
	}
	require.Equal(t, want, all, "by stream and partition; s1's partition 1 has no commit")
	one, err := admin.ExportOffsets(ctx, s2, group)
	require.NoError(t, err)
	require.Equal(t, []GroupOffset{{Stream: s2, Partition: 0, Offset: 4}}, one)

	set := []GroupOffset{{Stream: s1, Partition: 1, Offset: 99}, {Stream: s1, Partition: 0, Offset: 1}}
	_, err = m1.heartbeat(ctx, pool, nil) // live now, whatever the machine's load
	require.NoError(t, err)
	_, err = admin.SetOffsets(ctx, group, set, nil)
	require.ErrorIs(t, err, ErrGroupNotEmpty, "live members")
	changes, err := admin.SetOffsets(ctx, group, set, &SetOffsetsOpts{DryRun: true, Force: true})
	require.NoError(t, err)
	require.Len(t, changes, 2)
	three := int64(3)
	require.Equal(t, GroupOffsetChange{Stream: s1, OffsetChange: OffsetChange{Partition: 0, Previous: &three, New: 1}}, changes[0])
	require.Equal(t, int32(1), changes[1].Partition)
	require.Nil(t, changes[1].Previous)
	require.EqualValues(t, 10, changes[1].New, "clamped to the log end")
	after, err := admin.ExportOffsets(ctx, s1, group)
	require.NoError(t, err)
	require.Equal(t, []GroupOffset{{Stream: s1, Partition: 0, Offset: 3}}, after, "a dry run changes nothing")
	require.NoError(t, m1.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 3}}, nil), "nor expels anyone")

	for _, bad := range [][]GroupOffset{
		{{Stream: s1, Partition: 0, Offset: 0}, {Stream: s1, Partition: 7, Offset: 0}},
		{{Stream: s1, Partition: 0, Offset: 0}, {Stream: s1, Partition: 0, Offset: 1}},
		{{Stream: s1, Partition: 0, Offset: -1}},
	} {
		_, err = admin.SetOffsets(ctx, group, bad, &SetOffsetsOpts{Force: true})
		require.ErrorIs(t, err, ErrInvalidArgument, "%v", bad)
	}
	after, err = admin.ExportOffsets(ctx, "", group)
	require.NoError(t, err)
	require.Equal(t, want, after, "a refused set writes nothing")

	for _, m := range []*member{m1, m2} {
		_, err = m.heartbeat(ctx, pool, nil)
		require.NoError(t, err)
	}
	_, err = admin.SetOffsets(ctx, group, set, &SetOffsetsOpts{Force: true})
	require.NoError(t, err)
	after, err = admin.ExportOffsets(ctx, s1, group)
	require.NoError(t, err)
	require.Equal(t, []GroupOffset{{Stream: s1, Partition: 0, Offset: 1}, {Stream: s1, Partition: 1, Offset: 10}}, after)
	require.ErrorIs(t, m1.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 5}}, nil), ErrFenced,
		"a forced set expels the stream's live member")
	require.NoError(t, m2.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 5}}, nil),
		"the other stream's member is not touched")
}
