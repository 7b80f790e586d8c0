package eventstore_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/eventstore"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// Seed 004: a key has snapshots at several versions; SnapshotVersions lists them,
// SnapshotAt loads the one at a version, and LoadAt rebuilds the state as of any
// version from the nearest snapshot at or below it and the events after it.
func TestSnapshotVersionsAndLoadAt(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for i := 1; i <= 7; i++ {
		_, err := f.store.Append(f.ctx, f.stream, "k", eventstore.AnyVersion, ev("x", i))
		require.NoError(t, err)
	}
	versions, err := f.store.SnapshotVersions(f.ctx, f.stream, "k")
	require.NoError(t, err)
	require.Empty(t, versions)
	for _, v := range []int64{5, 2} {
		require.NoError(t, f.store.SaveSnapshot(f.ctx, f.stream, "k", v,
			eventstore.SnapshotData{Data: json.RawMessage(fmt.Sprintf(`{"at":%d}`, v))}))
	}
	versions, err = f.store.SnapshotVersions(f.ctx, f.stream, "k")
	require.NoError(t, err)
	require.Equal(t, []int64{2, 5}, versions)

	sn, err := f.store.SnapshotAt(f.ctx, f.stream, "k", 2)
	require.NoError(t, err)
	require.EqualValues(t, 2, sn.Version)
	require.JSONEq(t, `{"at":2}`, string(sn.Data))
	_, err = f.store.SnapshotAt(f.ctx, f.stream, "k", 3)
	require.ErrorIs(t, err, eventstore.ErrSnapshotNotFound)

	keyVersions := func(evs []eventstore.StoredEvent) []int64 {
		var out []int64
		for _, e := range evs {
			out = append(out, e.KeyVersion)
		}
		return out
	}
	for _, c := range []struct {
		at       int64
		snapshot int64 // 0: none
		events   []int64
	}{
		{1, 0, []int64{1}},
		{2, 2, nil},
		{4, 2, []int64{3, 4}},
		{6, 5, []int64{6}},
		{99, 5, []int64{6, 7}},
	} {
		sn, evs, err := f.store.LoadAt(f.ctx, f.stream, "k", c.at)
		require.NoError(t, err, "at %d", c.at)
		if c.snapshot == 0 {
			require.Nil(t, sn, "at %d", c.at)
		} else {
			require.NotNil(t, sn, "at %d", c.at)
			require.Equal(t, c.snapshot, sn.Version, "at %d", c.at)
		}
		require.Equal(t, c.events, keyVersions(evs), "at %d", c.at)
	}

	// Bad input.
	_, err = f.store.SnapshotAt(f.ctx, f.stream, "k", 0)
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	_, _, err = f.store.LoadAt(f.ctx, f.stream, "k", -1)
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	missing := testdb.Name("missing")
	_, err = f.store.SnapshotVersions(f.ctx, missing, "k")
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
	_, err = f.store.SnapshotAt(f.ctx, missing, "k", 1)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
	_, _, err = f.store.LoadAt(f.ctx, missing, "k", 1)
	require.ErrorIs(t, err, streams.ErrStreamNotFound)
	plain := testdb.Name("plain")
	require.NoError(t, f.client.CreateStream(f.ctx, plain, 1))
	_, err = f.store.SnapshotVersions(f.ctx, plain, "k")
	require.ErrorIs(t, err, eventstore.ErrNotVersioned)
}
