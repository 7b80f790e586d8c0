package streams_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// Idle producer state expires (Kafka's producer.id.expiration.ms): a producer's
// sequences on a partition it appended nothing to for the idle time are forgotten,
// and its id with them once no partition state is left; state in use stays. A
// forgotten producer is new to the partition (sequence 0 again), and InitProducer
// gives its old id a new one instead of fencing it.
func TestExpireProducersForgetsIdleState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := streams.NewClient(pool, nil)
	s := testdb.Name("s")
	require.NoError(t, c.CreateStream(ctx, s, 2))
	seq := func(id int64, first int32) *streams.AppendPartitionOpts {
		return &streams.AppendPartitionOpts{Producer: &streams.ProducerSequence{ProducerID: id, FirstSequence: first}}
	}
	idle, _, err := c.InitProducer(ctx, -1, -1)
	require.NoError(t, err)
	busy, _, err := c.InitProducer(ctx, -1, -1)
	require.NoError(t, err)
	for _, p := range []int32{0, 1} {
		_, err = c.AppendPartition(ctx, s, p, make([]streams.Record, 2), seq(idle, 0))
		require.NoError(t, err)
	}
	_, err = c.AppendPartition(ctx, s, 0, make([]streams.Record, 2), seq(busy, 0))
	require.NoError(t, err)
	// Two hours pass for idle's state, and for both ids (busy appended just now).
	_, err = pool.Exec(ctx, `UPDATE streamd.producer_partitions SET updated_at = updated_at - interval '2 hours'
		WHERE stream_name = $1 AND producer_id = $2`, s, idle)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE streamd.producers SET updated_at = updated_at - interval '2 hours'
		WHERE producer_id = ANY($1)`, []int64{idle, busy})
	require.NoError(t, err)

	_, err = c.ExpireProducers(ctx, 0, nil)
	require.ErrorIs(t, err, streams.ErrInvalidArgument)
	got, err := c.ExpireProducers(ctx, 3*time.Hour, nil)
	require.NoError(t, err)
	states := func(id int64) (n int) {
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.producer_partitions WHERE stream_name = $1 AND producer_id = $2",
			s, id).Scan(&n))
		return n
	}
	require.Equal(t, 2, states(idle), "not idle for 3 hours")
	got, err = c.ExpireProducers(ctx, time.Hour, &streams.ExpireProducersOpts{Now: time.Now()})
	require.NoError(t, err)
	require.GreaterOrEqual(t, got.PartitionStates, int64(2))
	require.GreaterOrEqual(t, got.Producers, int64(1))
	require.Zero(t, states(idle), "idle's state is gone")
	require.Equal(t, 1, states(busy), "busy's state stays")
	var ids []int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT array_agg(producer_id ORDER BY producer_id) FROM streamd.producers WHERE producer_id = ANY($1)",
		[]int64{idle, busy}).Scan(&ids))
	require.Equal(t, []int64{busy}, ids, "an id with partition state stays")

	_, err = c.AppendPartition(ctx, s, 0, make([]streams.Record, 1), seq(busy, 2))
	require.NoError(t, err, "busy carries on")
	_, err = c.AppendPartition(ctx, s, 0, make([]streams.Record, 1), seq(idle, 2))
	require.ErrorIs(t, err, streams.ErrOutOfOrderSequence, "idle is new to the partition")
	again, epoch, err := c.InitProducer(ctx, idle, 0)
	require.NoError(t, err, "a forgotten id gets a new one, not a fence")
	require.NotEqual(t, idle, again)
	require.Zero(t, epoch)
	_, err = c.AppendPartition(ctx, s, 0, make([]streams.Record, 1), seq(again, 0))
	require.NoError(t, err)
}
