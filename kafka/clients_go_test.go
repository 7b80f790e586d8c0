package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	segkafka "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// delivered collects the records a group of consumers processed, by partition and
// offset (at-least-once: a record may come twice across a rebalance).
type delivered struct {
	mu   sync.Mutex
	seen map[[2]int64]string
}

func newDelivered() *delivered { return &delivered{seen: map[[2]int64]string{}} }

func (d *delivered) add(partition int32, offset int64, value []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seen[[2]int64{int64(partition), offset}] = string(value)
}

func (d *delivered) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.seen)
}

func (d *delivered) values() map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]bool{}
	for _, v := range d.seen {
		out[v] = true
	}
	return out
}

// saramaHandler marks and commits every message it is given.
type saramaHandler struct{ got *delivered }

func (saramaHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (saramaHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h saramaHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		h.got.add(msg.Partition, msg.Offset, msg.Value)
		sess.MarkMessage(msg, "")
		if len(claim.Messages()) == 0 {
			sess.Commit()
		}
	}
	return nil
}

// IBM/sarama: an idempotent SyncProducer (snappy, with headers) and two members of a
// consumer group on sarama's default classic protocol (range assignor) process every
// record; the group's commits leave it with no lag; streams.Client reads what sarama
// produced with the same key, value and headers.
func TestSaramaProducesAndConsumesInAGroup(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	topic, group := testdb.Name("sarama"), testdb.Name("sarama")
	const partitions, n = 3, 300
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, partitions))

	cfg := sarama.NewConfig()
	cfg.ClientID = "streamd-test"
	cfg.Producer.Return.Successes = true
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Compression = sarama.CompressionSnappy
	cfg.Net.MaxOpenRequests = 1
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Group.Session.Timeout = 3 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 200 * time.Millisecond
	cfg.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	cfg.Consumer.MaxWaitTime = 200 * time.Millisecond
	cfg.Metadata.RefreshFrequency = time.Second

	prod, err := sarama.NewSyncProducer([]string{ts.addr}, cfg)
	require.NoError(t, err)
	defer prod.Close()
	msgs := make([]*sarama.ProducerMessage, n)
	for i := range msgs {
		msgs[i] = &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprintf("k%d", i)),
			Value:   sarama.ByteEncoder(fmt.Sprintf("v%d", i)),
			Headers: []sarama.RecordHeader{{Key: []byte("h"), Value: []byte{0, byte(i)}}}}
	}
	require.NoError(t, prod.SendMessages(msgs[:n/2]))
	for _, m := range msgs[n/2:] {
		_, _, err := prod.SendMessage(m)
		require.NoError(t, err)
	}

	got := newDelivered()
	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 2 {
		cg, err := sarama.NewConsumerGroup([]string{ts.addr}, group, cfg)
		require.NoError(t, err)
		wg.Add(1)
		go func() { // owner: this test, which stops and waits for it below
			defer wg.Done()
			defer cg.Close()
			for cctx.Err() == nil {
				if err := cg.Consume(cctx, []string{topic}, saramaHandler{got: got}); err != nil && cctx.Err() == nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	deadline := time.Now().Add(45 * time.Second)
	for got.count() < n && time.Now().Before(deadline) {
		select {
		case err := <-errs:
			t.Logf("sarama group: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	require.Equal(t, n, got.count(), "every record delivered")
	require.Eventually(t, func() bool { return groupLagZero(t, pool, topic, group) }, 30*time.Second, 20*time.Millisecond,
		"the group committed everything")
	stop()
	wg.Wait()
	for i := range n {
		require.True(t, got.values()[fmt.Sprintf("v%d", i)], "v%d", i)
	}

	// The same bytes from the Go side, and sarama's key partitioner put k0 where it put it.
	p := int32(-1)
	var res *streams.FetchResult
	for q := int32(0); q < partitions && p < 0; q++ {
		res, err = sc.Fetch(ctx, topic, q, 0, &streams.FetchOpts{MaxRecords: n})
		require.NoError(t, err)
		for _, e := range res.Events {
			if e.Key == "k0" {
				p = q
				require.Equal(t, []byte("v0"), e.Bytes)
				require.Equal(t, []streams.Header{{Key: "h", Value: []byte{0, 0}}}, e.RawHeaders)
			}
		}
	}
	require.GreaterOrEqual(t, p, int32(0), "k0 stored")
}

// segmentio/kafka-go: a Writer (lz4, hash balancer, acks all) and two Readers with a
// GroupID (kafka-go's classic group client, synchronous commits) process every record
// and commit it all; the records carry their keys and headers.
func TestKafkaGoWriterAndGroupReaders(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, nil)
	ctx := testCtx(t)
	topic, group := testdb.Name("kafkago"), testdb.Name("kafkago")
	const partitions, n = 3, 300
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, partitions))

	w := &segkafka.Writer{Addr: segkafka.TCP(ts.addr), Topic: topic, Balancer: &segkafka.Hash{},
		BatchTimeout: 5 * time.Millisecond, RequiredAcks: segkafka.RequireAll, Compression: compress.Lz4}
	defer w.Close()
	msgs := make([]segkafka.Message, n)
	for i := range msgs {
		msgs[i] = segkafka.Message{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("v%d", i)),
			Headers: []segkafka.Header{{Key: "h", Value: []byte("x")}}}
	}
	require.NoError(t, w.WriteMessages(ctx, msgs...))

	got := newDelivered()
	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		r := segkafka.NewReader(segkafka.ReaderConfig{Brokers: []string{ts.addr}, GroupID: group, Topic: topic,
			StartOffset: segkafka.FirstOffset, MaxWait: 200 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond,
			SessionTimeout: 3 * time.Second, RebalanceTimeout: 5 * time.Second, JoinGroupBackoff: 100 * time.Millisecond,
			ReadBackoffMin: 10 * time.Millisecond, ReadBackoffMax: 100 * time.Millisecond})
		wg.Add(1)
		go func() { // owner: this test, which stops and waits for it below
			defer wg.Done()
			defer r.Close()
			for {
				m, err := r.FetchMessage(cctx)
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						t.Logf("kafka-go fetch: %v", err)
					}
					return
				}
				if string(m.Key) == "" || len(m.Headers) != 1 || string(m.Headers[0].Value) != "x" {
					t.Errorf("record %d/%d: key %q headers %v", m.Partition, m.Offset, m.Key, m.Headers)
				}
				got.add(int32(m.Partition), m.Offset, m.Value)
				if err := r.CommitMessages(cctx, m); err != nil && cctx.Err() == nil {
					t.Logf("kafka-go commit: %v", err)
				}
			}
		}()
	}
	require.Eventually(t, func() bool { return got.count() == n }, 45*time.Second, 20*time.Millisecond, "every record delivered")
	require.Eventually(t, func() bool { return groupLagZero(t, pool, topic, group) }, 30*time.Second, 20*time.Millisecond,
		"the group committed everything")
	stop()
	wg.Wait()
	for i := range n {
		require.True(t, got.values()[fmt.Sprintf("v%d", i)], "v%d", i)
	}
}
