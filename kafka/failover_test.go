package kafka

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// An idempotent producer whose broker stops carries on against the other instance:
// its sequences are in PostgreSQL, so the batches it retries there are neither lost
// nor stored twice.
func TestProducerCarriesOnAcrossInstances(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	listener := testdb.Name("failover")
	a := startServer(t, pool, &Config{Listener: listener, ShutdownTimeout: time.Second})
	b := startServer(t, pool, &Config{Listener: listener})
	ctx := testCtx(t)
	topic := testdb.Name("failover")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 4))
	prod := newClient(t, []string{a.addr, b.addr}, kgo.DefaultProduceTopic(topic),
		kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }), kgo.MetadataMinAge(50*time.Millisecond))

	const n = 200
	for i := range n {
		if i == n/4 {
			a.stop() // half the partitions' leader goes away
		}
		r := &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("v%d", i))}
		require.NoError(t, prod.ProduceSync(ctx, r).FirstErr(), "record %d", i)
	}
	seen := map[string]int{}
	for p := int32(0); p < 4; p++ {
		res, err := sc.Fetch(ctx, topic, p, 0, &streams.FetchOpts{MaxRecords: n})
		require.NoError(t, err)
		for _, e := range res.Events {
			seen[string(e.Bytes)]++
		}
	}
	require.Len(t, seen, n)
	for v, c := range seen {
		require.Equal(t, 1, c, v)
	}
}
