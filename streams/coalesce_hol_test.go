package streams_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// A default client's small Produce calls that wait for a head row another
// transaction holds (a long ProduceTx, say) do not stall the client's calls to other
// streams while the pool has connections to spare: a transaction that has run for
// appendStallAfter no longer counts against the two in flight, so a call waits at
// most that long where a transaction per call would not have waited (found in
// review: two blocked calls held both default slots, and a call to another stream
// waited for as long as the lock was held).
func TestBlockedAppendsDoNotStallOtherStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	require.Greater(t, pool.Config().MaxConns, int32(3), "the pool has connections to spare")
	c := streams.NewClient(pool, nil)
	s, other := testdb.Name("s"), testdb.Name("other")
	require.NoError(t, c.CreateStream(ctx, s, 2))
	require.NoError(t, c.CreateStream(ctx, other, 1))

	outside, waitBlocked := lockHeads(t, pool, s)
	rec := func(stream string, p int32, id string) streams.Record {
		return streams.Record{Stream: stream, Partition: streams.PartitionOf(p), EventID: id, Data: json.RawMessage(`1`)}
	}
	a := goProduce(ctx, c, rec(s, 0, "a"))
	waitBlocked(1)
	b := goProduce(ctx, c, rec(s, 1, "b"))
	waitBlocked(2)

	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := c.Produce(octx, rec(other, 0, "o"))
	require.NoError(t, err, "a call to another stream waited behind calls blocked on a head row")

	require.NoError(t, outside.Commit(ctx))
	require.NoError(t, (<-a).err)
	require.NoError(t, (<-b).err)
	// The stalled transactions, once ended, count no more: left counted, the client
	// would run more than its two at once from then on.
	running, stalled := c.AppendsRunning()
	require.Equal(t, [2]int{0, 0}, [2]int{running, stalled}, "transactions running, stalled")
}
