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

// A franz-go producer (idempotent, its defaults) whose state the leader expired while
// it was idle carries on: its next batch is out of order for the forgotten state
// (OUT_OF_ORDER_SEQUENCE_NUMBER), so it resets its sequences under a new epoch
// (franz-go bumps it itself) or a new producer id, and starts again at sequence 0;
// every record is stored once.
func TestProducerCarriesOnAfterItsStateExpired(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	topic := testdb.Name("expiry")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 1))
	prod := newClient(t, []string{ts.addr}, kgo.DefaultProduceTopic(topic))
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			require.NoError(t, prod.ProduceSync(ctx, &kgo.Record{Value: []byte(fmt.Sprintf("v%d", i))}).FirstErr(), "record %d", i)
		}
	}
	produce(0, 5)
	var id int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT producer_id FROM streamd.producer_partitions WHERE stream_name = $1", topic).Scan(&id))
	// Two hours pass for this producer.
	_, err := pool.Exec(ctx, "UPDATE streamd.producer_partitions SET updated_at = updated_at - interval '2 hours' WHERE stream_name = $1", topic)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE streamd.producers SET updated_at = updated_at - interval '2 hours' WHERE producer_id = $1", id)
	require.NoError(t, err)
	got, err := sc.ExpireProducers(ctx, time.Hour, nil)
	require.NoError(t, err)
	require.Positive(t, got.Producers)
	var left int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.producer_partitions WHERE stream_name = $1", topic).Scan(&left))
	require.Zero(t, left, "expired")

	produce(5, 10)
	res, err := sc.Fetch(ctx, topic, 0, 0, nil)
	require.NoError(t, err)
	require.Len(t, res.Events, 10, "every record once")
	for i, e := range res.Events {
		require.Equal(t, fmt.Sprintf("v%d", i), string(e.Bytes))
	}
	var now int64
	var epoch int16
	require.NoError(t, pool.QueryRow(ctx, "SELECT producer_id, epoch FROM streamd.producer_partitions WHERE stream_name = $1", topic).Scan(&now, &epoch))
	require.True(t, now != id || epoch > 0, "a new producer id or epoch (id %d epoch %d, before %d)", now, epoch, id)
}
