package brokers_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/brokers"
	"github.com/streamd/streamd/internal/testdb"
)

func nodeIDs(t *testing.T, ctx context.Context, listener string) []int32 {
	t.Helper()
	pool := testdb.Pool(t)
	live, err := brokers.Live(ctx, pool, listener)
	require.NoError(t, err)
	var out []int32
	for _, b := range live {
		out = append(out, b.NodeID)
	}
	return out
}

// A registration is listed while it heartbeats, keeps its node id across a restart
// at the same address, and leaves the list when Run ends (at once) or its TTL passes.
func TestRegistrationLifecycle(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	listener := testdb.Name("lifecycle")
	cfg := &brokers.Config{Listener: listener, TTL: 300 * time.Millisecond}

	a, err := brokers.Register(ctx, pool, "127.0.0.1", 19092, cfg)
	require.NoError(t, err)
	b, err := brokers.Register(ctx, pool, "127.0.0.1", 19093, cfg)
	require.NoError(t, err)
	require.NotEqual(t, a.NodeID(), b.NodeID())
	require.ElementsMatch(t, []int32{a.NodeID(), b.NodeID()}, nodeIDs(t, ctx, listener))
	require.Empty(t, nodeIDs(t, ctx, testdb.Name("other")), "another listener sees none of them")

	// A restarted instance at a's address takes a's node id.
	a2, err := brokers.Register(ctx, pool, "127.0.0.1", 19092, cfg)
	require.NoError(t, err)
	require.Equal(t, a.NodeID(), a2.NodeID())

	// a2 heartbeats and outlives its TTL; b does not and expires.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a2.Run(runCtx) }()
	require.Eventually(t, func() bool {
		ids := nodeIDs(t, ctx, listener)
		return len(ids) == 1 && ids[0] == a2.NodeID()
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []int32{a2.NodeID()}, nodeIDs(t, ctx, listener), "a running registration stays listed")

	stop()
	require.NoError(t, <-done)
	require.Empty(t, nodeIDs(t, ctx, listener), "a stopped registration is removed at once")
}

func TestRegisterRefusesBadInput(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	listener := testdb.Name("bad")
	_, err := brokers.Register(ctx, pool, "", 9092, &brokers.Config{Listener: listener})
	require.ErrorContains(t, err, "host")
	_, err = brokers.Register(ctx, pool, "h", 0, &brokers.Config{Listener: listener})
	require.ErrorContains(t, err, "port")
	_, err = brokers.Register(ctx, pool, "h", 9092, &brokers.Config{Listener: listener, TTL: time.Millisecond})
	require.ErrorContains(t, err, "TTL")
	require.Empty(t, nodeIDs(t, ctx, listener), "nothing was written")
}
