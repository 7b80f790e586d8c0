package streams_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// A call that the one-statement path declines (no row: here a partition the stream
// lacks) in a shared transaction must not make the other calls, which that
// transaction committed, be appended again and answered Duplicate (found in review:
// seenRow took the declined statement's no-row for a failed statement).
func TestSharedTransactionWithADeclinedCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, c, s := oneSlotClient(t, 2)
	tx, first := holdTheLine(t, pool, c, s)
	rec := func(p int32, id string) streams.Record {
		return streams.Record{Stream: s, Partition: streams.PartitionOf(p), EventID: id, Data: json.RawMessage(`2`)}
	}
	var results []<-chan produceResult
	for _, recs := range [][]streams.Record{{rec(0, "good1")}, {rec(5, "bad")}, {rec(1, "good2")}} {
		results = append(results, goProduce(ctx, c, recs...))
		n := len(results)
		testdb.WaitFor(t, 5*time.Second, "the call to wait", func() bool { return c.AppendsWaiting() == n })
	}
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, (<-first).err)
	good1, bad, good2 := <-results[0], <-results[1], <-results[2]
	require.True(t, errors.Is(bad.err, streams.ErrPartitionNotFound), "got %v", bad.err)
	require.NoError(t, good1.err)
	require.NoError(t, good2.err)
	require.False(t, good1.pos[0].Duplicate, "good1 was stored by this call, not before it")
	require.False(t, good2.pos[0].Duplicate, "good2 was stored by this call, not before it")
}
