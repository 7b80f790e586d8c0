package kafka

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// A Produce request waiting for its partition (here: a transaction holds the head
// row) does not hold up the connection's next Produce to another partition: the
// second is stored while the first still waits, and both are answered, in order.
func TestProduceRequestsOfOneConnectionRunSideBySide(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("pipe")
	require.NoError(t, sc.CreateStream(ctx, topic, 2))
	cl := newClient(t, []string{ts.addr}, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0), kgo.ProduceRequestTimeout(time.Minute))
	// A first answer lets franz-go keep several requests in flight.
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: []byte("a")}, &kgo.Record{Partition: 1, Value: []byte("b")}).FirstErr())

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM streamd.stream_partitions WHERE stream_name = $1 AND partition = 0 FOR UPDATE", topic)
	require.NoError(t, err)

	var wg sync.WaitGroup
	results := make([]error, 2)
	order := make(chan int32, 2)
	wg.Add(2)
	cl.Produce(ctx, &kgo.Record{Partition: 0, Value: []byte("blocked")}, func(_ *kgo.Record, err error) {
		results[0] = err
		order <- 0
		wg.Done()
	})
	// Send the second once the first waits for the head row, so they are two requests.
	testdb.WaitForLockWait(t, pool, tx, "append_reserve_producer")
	cl.Produce(ctx, &kgo.Record{Partition: 1, Value: []byte("free")}, func(_ *kgo.Record, err error) {
		results[1] = err
		order <- 1
		wg.Done()
	})
	testdb.WaitFor(t, 20*time.Second, "the second produce (partition 1) to be stored while the first waits", func() bool {
		info, err := sc.DescribeStream(ctx, topic)
		require.NoError(t, err)
		return info.PartitionInfo[1].NextOffset == 2
	})
	info, err := sc.DescribeStream(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, int64(1), info.PartitionInfo[0].NextOffset, "the first is still waiting")
	require.NoError(t, tx.Rollback(ctx))
	wg.Wait()
	require.NoError(t, results[0])
	require.NoError(t, results[1])
	require.Equal(t, int32(0), <-order, "answers come in the order of the requests")
	require.Equal(t, int32(1), <-order)
}

// An idempotent producer with many requests in flight on one connection: every
// partition's records are stored once each, in the order produced.
func TestPipelinedProduceKeepsEachPartitionsOrder(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("pipeord")
	const partitions, n = 3, 600
	require.NoError(t, sc.CreateStream(ctx, topic, partitions))
	cl := newClient(t, []string{ts.addr}, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0), kgo.MaxBufferedRecords(50))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []error
	for i := range n {
		wg.Add(1)
		cl.Produce(ctx, &kgo.Record{Partition: int32(i % partitions), Value: []byte(strconv.Itoa(i))}, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				failed = append(failed, err)
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	require.Empty(t, failed)
	for p := range int32(partitions) {
		res, err := sc.Fetch(ctx, topic, p, 0, &streams.FetchOpts{MaxRecords: n})
		require.NoError(t, err)
		require.Len(t, res.Events, n/partitions, "partition %d", p)
		for j, e := range res.Events {
			require.Equal(t, fmt.Sprint(j*partitions+int(p)), string(e.Bytes), "partition %d offset %d", p, e.Offset)
		}
	}
}
