package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/localpg"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// startKafkaBroker starts `streamd serve --kafka-addr` as a child process on the
// database at url and returns it with its Kafka address.
func startKafkaBroker(t *testing.T, url string) (*exec.Cmd, string) {
	t.Helper()
	kafkaAddr := freeAddr(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$", "--", "serve", "--http-addr", freeAddr(t), "--auth-disabled",
		"--kafka-addr", kafkaAddr, "--retention-streams", "none")
	cmd.Env = append(os.Environ(), "STREAMD_TEST_AS_MAIN=1", localpg.EnvDatabaseURL+"="+url)
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		if t.Failed() {
			t.Logf("streamd %d output:\n%s", cmd.Process.Pid, logs.String())
		}
	})
	return cmd, kafkaAddr
}

// syncBuffer is a strings.Builder safe for the child's stdout and stderr at once.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestKafkaClientsSurviveKill9OfABroker: two `streamd serve` processes on one
// database are two brokers. An idempotent franz-go producer and a group of two
// franz-go consumers, seeded with both, run while one broker (leader of some of the
// partitions) is killed with SIGKILL mid-stream, with produce batches in flight. The clients carry on against the other broker: every record is stored
// exactly once (the producer's retries of batches the dead broker may have committed
// are recognised by their sequences, kept in PostgreSQL), every record is processed,
// the group commits to the end, and no committed offset ever goes back.
func TestKafkaClientsSurviveKill9OfABroker(t *testing.T) {
	t.Parallel()
	// A database of its own: Metadata lists every live broker of the database, and
	// other tests' servers must not be among them.
	url := testdb.FreshDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a, addrA := startKafkaBroker(t, url)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	liveBrokers := func() int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM streamd.kafka_brokers WHERE expires_at > now()").Scan(&n); err != nil {
			return 0 // not migrated yet
		}
		return n
	}
	require.Eventually(t, func() bool { return liveBrokers() == 1 }, 60*time.Second, 20*time.Millisecond, "the first broker is up")
	_, addrB := startKafkaBroker(t, url)
	require.Eventually(t, func() bool { return liveBrokers() == 2 }, 60*time.Second, 20*time.Millisecond, "the second broker is up")

	topic, group := "orders", "billing"
	const partitions, n = 4, 2000
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, partitions))
	seeds := kgo.SeedBrokers(addrA, addrB)
	fast := []kgo.Opt{seeds, kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
		kgo.MetadataMinAge(100 * time.Millisecond), kgo.DialTimeout(time.Second)}

	// Committed offsets, watched for going backwards.
	var regressed []string
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() { // owner: this test, which stops it before checking regressed
		defer close(watchDone)
		last := map[int32]int64{}
		for watchCtx.Err() == nil {
			rows, err := pool.Query(watchCtx, `SELECT partition, "offset" FROM streamd.consumer_offsets WHERE stream_name = $1 AND group_id = $2`, topic, group)
			if err == nil {
				var p int32
				var o int64
				_, _ = pgx.ForEachRow(rows, []any{&p, &o}, func() error {
					if o < last[p] {
						regressed = append(regressed, fmt.Sprintf("partition %d: %d after %d", p, o, last[p]))
					}
					last[p] = o
					return nil
				})
			}
			select {
			case <-watchCtx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()

	// Two consumers in one group, at-least-once: record, then commit.
	var mu sync.Mutex
	processed := map[string]int{}
	consumersCtx, stopConsumers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		cl, err := kgo.NewClient(append(fast, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.SessionTimeout(3*time.Second),
			kgo.HeartbeatInterval(200*time.Millisecond), kgo.RebalanceTimeout(10*time.Second),
			kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.FetchMaxWait(200*time.Millisecond))...)
		require.NoError(t, err)
		wg.Add(1)
		go func() { // owner: this test, which stops and waits for it below
			defer wg.Done()
			defer cl.Close()
			for consumersCtx.Err() == nil {
				fs := cl.PollRecords(consumersCtx, 100)
				recs := fs.Records()
				mu.Lock()
				for _, r := range recs {
					processed[string(r.Value)]++
				}
				mu.Unlock()
				if len(recs) > 0 {
					_ = cl.CommitRecords(consumersCtx, recs...) // a refused commit is redelivered: at-least-once
				}
				cl.AllowRebalance()
			}
		}()
	}
	processedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(processed)
	}

	// The producer: idempotent (franz-go's default), retrying without limit, with a
	// small buffer so that batches are in flight all the time.
	prod, err := kgo.NewClient(append(fast, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(2*time.Millisecond),
		kgo.MaxBufferedRecords(50))...)
	require.NoError(t, err)
	defer prod.Close()
	// Both brokers serve: Metadata names the one to be killed leader of some
	// partitions, so the producer and the consumers talk to it.
	meta, err := kadm.NewClient(prod).Metadata(ctx, topic)
	require.NoError(t, err)
	led := 0
	for _, b := range meta.Brokers {
		if fmt.Sprintf("%s:%d", b.Host, b.Port) == addrA {
			for _, p := range meta.Topics[topic].Partitions {
				if p.Leader == b.NodeID {
					led++
				}
			}
		}
	}
	require.Positive(t, led, "the broker to be killed leads some partitions")

	// kill -9 of the first broker once a quarter of the records are consumed, while
	// the producer has batches in flight.
	killed := make(chan struct{})
	go func() { // owner: this test, which waits on killed below
		defer close(killed)
		for processedCount() < n/4 && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond) // polling interval
		}
		_ = a.Process.Signal(syscall.SIGKILL)
		_, _ = a.Process.Wait()
	}()
	var produceErrs []error
	var pmu sync.Mutex
	var pwg sync.WaitGroup
	for i := range n {
		pwg.Add(1)
		prod.Produce(ctx, &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i%97)), Value: []byte(fmt.Sprintf("v%d", i))},
			func(_ *kgo.Record, err error) {
				defer pwg.Done()
				if err != nil {
					pmu.Lock()
					produceErrs = append(produceErrs, err)
					pmu.Unlock()
				}
			})
	}
	<-killed
	pwg.Wait()
	require.Empty(t, produceErrs, "every record acknowledged")

	// Stored exactly once.
	var stored, distinct int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT data_bytes) FROM streamd.events WHERE stream_name = $1",
		topic).Scan(&stored, &distinct))
	require.Equal(t, n, distinct, "every record stored")
	require.Equal(t, n, stored, "nothing stored twice")

	// Processed and committed to the end, through the surviving broker.
	lagZero := func() bool {
		var behind int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.stream_partitions h
			LEFT JOIN streamd.consumer_offsets co ON co.stream_name = h.stream_name AND co.partition = h.partition AND co.group_id = $2
			WHERE h.stream_name = $1 AND coalesce(co."offset", 0) < h.next_offset`, topic, group).Scan(&behind))
		return behind == 0
	}
	require.Eventually(t, func() bool { return processedCount() == n && lagZero() }, 90*time.Second, 20*time.Millisecond,
		"every record processed and committed")
	stopConsumers()
	wg.Wait()
	stopWatch()
	<-watchDone
	require.Empty(t, regressed, "committed offsets went backwards")
	for i := range n {
		require.Positive(t, processed[fmt.Sprintf("v%d", i)], "v%d processed", i)
	}
}
