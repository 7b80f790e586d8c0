package kafka

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

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

// A Fetch pipelined behind a Produce on one connection is answered after it, even
// when the Produce's answer is still waiting to be written once the Fetch has run
// (here: the connection's writer held): serve writes a reply itself only when none
// is queued before it.
func TestFetchBehindAProduceIsAnsweredAfterIt(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	topic := testdb.Name("pipefetch")
	require.NoError(t, sc.CreateStream(ctx, topic, 2))
	held, release := make(chan struct{}, 1), make(chan struct{})
	ts.srv.writeLoopHook = func() {
		select {
		case held <- struct{}{}:
		default:
		}
		<-release
	}
	c := rawConn(t, ts.addr)

	formatter := kmsg.NewRequestFormatter(kmsg.FormatterClientID("pipe"))
	produce := kmsg.NewPtrProduceRequest()
	produce.SetVersion(8)
	produce.Acks, produce.TimeoutMillis = -1, 10000
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic = topic
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Partition, pp.Records = 0, rawBatch(kmsg.Record{Value: []byte("first")})
	pt.Partitions = append(pt.Partitions, pp)
	produce.Topics = append(produce.Topics, pt)
	fetch := kmsg.NewPtrFetchRequest()
	fetch.SetVersion(11)
	fetch.ReplicaID, fetch.MaxBytes = -1, 1<<20 // MaxWaitMillis 0: answered at once
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = topic
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.Partition, fp.PartitionMaxBytes, fp.LogStartOffset = 1, 1<<20, -1
	ft.Partitions = append(ft.Partitions, fp)
	fetch.Topics = append(fetch.Topics, ft)
	_, err := c.Write(append(formatter.AppendRequest(nil, produce, 1), formatter.AppendRequest(nil, fetch, 2)...))
	require.NoError(t, err)

	<-held // the Produce's answer, ready and held
	fetches := ts.srv.metrics.requests.WithLabelValues("Fetch", "ok")
	testdb.WaitFor(t, 20*time.Second, "the Fetch to have run", func() bool { return promtestutil.ToFloat64(fetches) == 1 })
	close(release)
	for _, want := range []int32{1, 2} {
		var size [4]byte
		_, err := io.ReadFull(c, size[:])
		require.NoError(t, err)
		body := make([]byte, binary.BigEndian.Uint32(size[:]))
		_, err = io.ReadFull(c, body)
		require.NoError(t, err)
		require.Equal(t, want, int32(binary.BigEndian.Uint32(body[:4])), "answers come in the order of the requests")
	}
}
