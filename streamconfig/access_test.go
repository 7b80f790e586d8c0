package streamconfig_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streamconfig"
)

// TestAccessControlReader: AccessControl reads the stream's access_control_config; a
// stream without one, and a stream that does not exist, allow nobody (and cannot be
// told apart); a stored value that does not fit is ErrInvalidConfig.
func TestAccessControlReader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, c, name := setup(t)

	for _, stream := range []string{name, testdb.Name("missing")} {
		ac, err := store.AccessControl(ctx, stream)
		require.NoError(t, err)
		require.False(t, ac.Allows("alice", "read"), stream)
	}
	require.NoError(t, store.Set(ctx, name, &streamconfig.Config{AccessControl: &streamconfig.AccessControl{Readers: []string{"alice"}}}))
	ac, err := store.AccessControl(ctx, name)
	require.NoError(t, err)
	require.True(t, ac.Allows("alice", "read"))
	require.False(t, ac.Allows("alice", "write"))

	_, err = c.Pool().Exec(ctx, `UPDATE streamd.stream_configurations SET access_control_config = '{"readers": "alice"}' WHERE stream_name = $1`, name)
	require.NoError(t, err)
	_, err = store.AccessControl(ctx, name)
	require.ErrorIs(t, err, streamconfig.ErrInvalidConfig)
	require.ErrorContains(t, err, "access_control_config")
}
