package brokers_test

import (
	"context"
	"slices"
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

// A registration is listed, keeps its node id across a restart at the same address,
// leaves the list when its TTL passes without heartbeats, and at once when Run ends.
func TestRegistrationLifecycle(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	listener := testdb.Name("lifecycle")
	cfg := &brokers.Config{Listener: listener, TTL: time.Minute}

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

	// One that stops heartbeating expires.
	c, err := brokers.Register(ctx, pool, "127.0.0.1", 19094, &brokers.Config{Listener: listener, TTL: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ids := nodeIDs(t, ctx, listener)
		return len(ids) == 2 && !slices.Contains(ids, c.NodeID())
	}, 20*time.Second, 20*time.Millisecond)

	// Run ends: the row goes at once, long before its TTL.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a2.Run(runCtx) }()
	stop()
	require.NoError(t, <-done)
	require.Equal(t, []int32{b.NodeID()}, nodeIDs(t, ctx, listener), "a stopped registration is removed at once")
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

// Slots: an instance registers that many brokers at its address, each its own node
// id, stable across a restart; a restart with fewer slots removes the others' rows,
// and a stopped registration removes every slot's row at once. A bad slot count is
// refused before anything is written.
func TestRegistrationSlots(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	listener := testdb.Name("slots")
	a, err := brokers.Register(ctx, pool, "127.0.0.1", 19092, &brokers.Config{Listener: listener, Slots: 3, TTL: time.Minute})
	require.NoError(t, err)
	ids := a.NodeIDs()
	require.Len(t, ids, 3)
	require.Equal(t, ids[0], a.NodeID())
	require.Equal(t, ids, nodeIDs(t, ctx, listener))
	for i, b := range a.Selves() {
		require.Equal(t, ids[i], b.NodeID)
		require.Equal(t, "127.0.0.1", b.Host)
		require.Equal(t, int32(19092), b.Port)
	}

	a2, err := brokers.Register(ctx, pool, "127.0.0.1", 19092, &brokers.Config{Listener: listener, Slots: 2, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, ids[:2], a2.NodeIDs(), "a restart keeps its slots' node ids")
	require.Equal(t, ids[:2], nodeIDs(t, ctx, listener), "and drops the slots it no longer has")

	other, err := brokers.Register(ctx, pool, "127.0.0.1", 19093, &brokers.Config{Listener: listener, TTL: time.Minute})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a2.Run(runCtx) }()
	stop()
	require.NoError(t, <-done)
	require.Equal(t, []int32{other.NodeID()}, nodeIDs(t, ctx, listener), "a stopped registration removes every slot")

	for _, n := range []int{-1, brokers.MaxSlots + 1} {
		_, err = brokers.Register(ctx, pool, "127.0.0.1", 19094, &brokers.Config{Listener: listener, Slots: n})
		require.ErrorContains(t, err, "Slots")
	}
	require.Equal(t, []int32{other.NodeID()}, nodeIDs(t, ctx, listener), "nothing was written")
}

// TestHeartbeatUsesNoNodeIDs: renewing a registration takes no number of the node
// id sequence (an INSERT ... ON CONFLICT took one per slot per heartbeat: 64 slots
// of 10 instances ran the integer sequence out in about 130 days). Other tests may
// register brokers meanwhile, hence a bound rather than equality.
func TestHeartbeatUsesNoNodeIDs(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	listener := testdb.Name("renew")
	lastID := func() int64 {
		var v int64
		require.NoError(t, pool.QueryRow(ctx,
			"SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('streamd.kafka_brokers', 'node_id')::regclass), 0)").Scan(&v))
		return v
	}
	const slots, heartbeats = 4, 50
	first, err := brokers.Register(ctx, pool, "127.0.0.1", 19095, &brokers.Config{Listener: listener, Slots: slots, TTL: time.Minute})
	require.NoError(t, err)
	before := lastID()
	for range heartbeats {
		b, err := brokers.Register(ctx, pool, "127.0.0.1", 19095, &brokers.Config{Listener: listener, Slots: slots, TTL: time.Minute})
		require.NoError(t, err)
		require.Equal(t, first.NodeIDs(), b.NodeIDs())
	}
	require.Less(t, lastID()-before, int64(slots*heartbeats/2), "node ids taken by %d heartbeats of %d slots", heartbeats, slots)
	require.Equal(t, first.NodeIDs(), nodeIDs(t, ctx, listener))
}
