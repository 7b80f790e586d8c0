//go:build rabbitmq

// Integration tests against a real RabbitMQ: make test-rabbitmq (forward/rabbitmq-test.sh)
// starts a private broker and sets STREAMD_AMQP_URL. They fail when it is missing.
package forward_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/forward"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

const helperEnv = "STREAMD_FORWARD_HELPER"

func amqpURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("STREAMD_AMQP_URL")
	if u == "" {
		t.Fatal("STREAMD_AMQP_URL is not set: run make test-rabbitmq")
	}
	return u
}

func newForwarder(pool *pgxpool.Pool, url, stream, queue string) (*forward.Forwarder, error) {
	return forward.New(pool, &forward.Config{AMQPURL: url, Stream: stream, Queue: queue,
		MaxBatchSize: 7, SessionTimeout: 2 * time.Second})
}

// TestForwarderHelper is the forwarder process that TestKilledForwarderResumes kills
// with SIGKILL. It does nothing unless started by that test.
func TestForwarderHelper(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		return
	}
	pool, err := pgxpool.New(context.Background(), os.Getenv("STREAMD_DATABASE_URL"))
	require.NoError(t, err)
	f, err := newForwarder(pool, amqpURL(t), os.Getenv(helperEnv+"_STREAM"), os.Getenv(helperEnv+"_QUEUE"))
	require.NoError(t, err)
	require.NoError(t, f.Run(context.Background())) // runs until killed
}

type received struct {
	mu  sync.Mutex
	seq map[int64][]int64 // partition -> offsets in arrival order
	ids map[string]bool
}

func (r *received) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// The forwarder killed mid-stream (SIGKILL, no clean shutdown) resumes in another
// process from the last confirmed-and-committed batch: every event reaches the broker
// at least once, and per partition no event arrives before an earlier one was
// delivered (order kept; a redelivered tail is allowed).
func TestKilledForwarderResumes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	url := amqpURL(t)
	pool := testdb.Pool(t)
	client := streams.NewClient(pool, nil)
	stream, queue := testdb.Name("fwd"), testdb.Name("fwdq")
	require.NoError(t, client.CreateStream(ctx, stream, 3))
	produce := func(from, n int) {
		recs := make([]streams.Record, n)
		for i := range recs {
			recs[i] = streams.Record{Stream: stream, Key: strconv.Itoa((from + i) % 11), Data: json.RawMessage(strconv.Itoa(from + i))}
		}
		_, err := client.Produce(ctx, recs...)
		require.NoError(t, err)
	}

	// The broker-side consumer: records what arrives, in order.
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	require.NoError(t, err)
	got := &received{seq: map[int64][]int64{}, ids: map[string]bool{}}
	go func() { // owner: this test; exits when the connection closes (deferred above)
		for d := range deliveries {
			p, _ := d.Headers["streamd-partition"].(int64)
			o, _ := d.Headers["streamd-offset"].(int64)
			got.mu.Lock()
			got.seq[p] = append(got.seq[p], o)
			got.ids[d.MessageId] = true
			got.mu.Unlock()
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
			time.Sleep(10 * time.Millisecond) // polling interval, not a wait for a condition
		}
	}

	produce(0, 200)
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^TestForwarderHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperEnv+"_STREAM="+stream, helperEnv+"_QUEUE="+queue,
		"STREAMD_DATABASE_URL="+testdb.URL(t), "STREAMD_AMQP_URL="+url)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// Keep producing while it forwards, and kill it mid-stream.
	next := 200
	for got.distinct() < 60 {
		produce(next, 10)
		next += 10
		waitFor("the first forwarder to publish", func() bool { return got.distinct() > 0 })
	}
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	produce(next, 100)
	next += 100
	require.Less(t, got.distinct(), next, "the killed forwarder had forwarded everything: not mid-stream")

	// A new forwarder in this process takes over after the killed member's session.
	f, err := newForwarder(pool, url, stream, queue)
	require.NoError(t, err)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }() // owner: this test; exits at stop()
	waitFor(fmt.Sprintf("all %d events at the broker", next), func() bool { return got.distinct() == next })
	stop()
	require.NoError(t, <-done)

	got.mu.Lock()
	defer got.mu.Unlock()
	total := 0
	for p, seq := range got.seq {
		maxSeen := int64(-1)
		for _, o := range seq {
			require.LessOrEqual(t, o, maxSeen+1, "partition %d: offset %d arrived before %d", p, o, maxSeen+1)
			maxSeen = max(maxSeen, o)
		}
		total += int(maxSeen + 1)
	}
	require.Equal(t, next, total)
}

// TestUnroutableIsNeverCommitted: events the broker cannot route (no queue bound to
// the routing key) are returned, and the forwarder never commits them as delivered,
// however the return and the confirm race inside the AMQP library; it blocks on them,
// reporting them unroutable.
func TestUnroutableIsNeverCommitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := testdb.Name("fwd-unroutable")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, stream, 1))
	recs := make([]streams.Record, 20)
	for i := range recs {
		recs[i] = streams.Record{Stream: stream, Data: json.RawMessage(strconv.Itoa(i))}
	}
	_, err := streams.NewClient(pool, nil).Produce(ctx, recs...)
	require.NoError(t, err)
	f, err := forward.New(pool, &forward.Config{AMQPURL: amqpURL(t), Stream: stream,
		RoutingKey: testdb.Name("nowhere"), MaxBatchSize: 1, SessionTimeout: 2 * time.Second})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	time.Sleep(4 * time.Second) // the first event is published and returned again and again
	cancel()
	require.NoError(t, <-done)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.consumer_offsets WHERE stream_name = $1 AND \"offset\" > 0", stream).Scan(&n))
	require.Zero(t, n, "an unroutable event was committed as delivered")
}
