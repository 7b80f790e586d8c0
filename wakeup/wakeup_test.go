package wakeup_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/tailer/tailertest"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/internal/testmetrics"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// run starts r.Run(ctx) until the test ends and checks it returns nil on cancel.
func run(t *testing.T, name string, r interface{ Run(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }() // owner: the test; exits at cleanup (cancel)
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "%s: Run returns nil after ctx ends", name)
		case <-time.After(10 * time.Second):
			t.Errorf("%s did not stop within 10s of cancel", name)
		}
	})
}

// fastBroadcaster returns a broadcaster with test-sized backoffs.
func fastBroadcaster(t *testing.T, url string, mod func(*wakeup.BroadcasterConfig)) *wakeup.Broadcaster {
	t.Helper()
	cfg := &wakeup.BroadcasterConfig{
		ConnString:       url,
		MinBackoff:       20 * time.Millisecond,
		MaxBackoff:       200 * time.Millisecond,
		StatusInterval:   200 * time.Millisecond,
		UnsupportedRetry: 100 * time.Millisecond,
	}
	if mod != nil {
		mod(cfg)
	}
	b, err := wakeup.NewBroadcaster(cfg)
	require.NoError(t, err)
	run(t, "broadcaster", b)
	return b
}

func fastListener(t *testing.T, url string) *wakeup.Listener {
	t.Helper()
	l, err := wakeup.NewListener(&wakeup.ListenerConfig{ConnString: url, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	require.NoError(t, err)
	run(t, "listener", l)
	return l
}

func drain(c <-chan struct{}) {
	select {
	case <-c:
	default:
	}
}

func requireWoken(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("no wake-up for %s", what)
	}
}

// TestBroadcastWakesListenersForEveryPartitionAndQueue: through the whole path
// (commit, WAL, tailer, pg_notify from the broadcaster, the shared LISTEN connection,
// the hub), a commit on each partition of a stream wakes the stream's subscribers
// and that partition's, and a message to each queue wakes that queue's.
func TestBroadcastWakesListenersForEveryPartitionAndQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, url := sharedPool(t)
	const parts = 6
	stream := testdb.Name("wk")
	c := streams.NewClient(pool, nil)
	require.NoError(t, c.CreateStream(ctx, stream, parts))
	queues := []string{testdb.Name("wq"), testdb.Name("wq")}
	for _, q := range queues { // a plain INSERT into an unknown queue is refused
		_, err := pool.Exec(ctx, `INSERT INTO streamd.queues (queue_name) VALUES ($1)`, q)
		require.NoError(t, err)
	}

	// A pool's connection string (pool_* settings) is accepted.
	l := fastListener(t, url+" pool_max_conns=3")
	sub := l.Subscribe(wakeup.KindStream, stream)
	defer sub.Close()
	b := fastBroadcaster(t, url+" pool_max_conns=3", nil)
	testdb.WaitFor(t, 90*time.Second, "broadcaster streaming and listener connected", func() bool { return b.Streaming() && l.Connected() })

	partSubs := make([]*wakeup.Subscription, parts)
	for p := range partSubs {
		partSubs[p] = l.SubscribePartition(stream, int32(p))
		defer partSubs[p].Close()
	}
	for p := int32(0); p < parts; p++ {
		drain(sub.C)
		drain(partSubs[p].C)
		_, err := c.Produce(ctx, streams.Record{Stream: stream, Partition: streams.PartitionOf(p), Data: []byte(`{}`)})
		require.NoError(t, err)
		requireWoken(t, sub.C, fmt.Sprintf("stream, partition %d", p))
		requireWoken(t, partSubs[p].C, fmt.Sprintf("partition %d's subscriber", p))
	}
	for _, q := range queues {
		qs := l.Subscribe(wakeup.KindQueue, q)
		_, err := pool.Exec(ctx, `INSERT INTO streamd.messages (stream_name, message_id, data) VALUES ($1, gen_random_uuid()::text, '{}')`, q)
		require.NoError(t, err)
		requireWoken(t, qs.C, "queue "+q)
		qs.Close()
	}
}

// TestBroadcastCoalesces: a burst of commits to a few streams costs far fewer
// notifications than commits, and every stream's subscriber is still woken after
// its last commit.
func TestBroadcastCoalesces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, url := sharedPool(t)
	c := streams.NewClient(pool, nil)
	names := []string{testdb.Name("wc"), testdb.Name("wc"), testdb.Name("wc")}
	for _, n := range names {
		require.NoError(t, c.CreateStream(ctx, n, 1))
	}
	reg := prometheus.NewRegistry()
	l := fastListener(t, url)
	b := fastBroadcaster(t, url, func(c *wakeup.BroadcasterConfig) {
		c.FlushInterval = 50 * time.Millisecond
		c.Registerer = reg
	})
	testdb.WaitFor(t, 90*time.Second, "broadcaster streaming and listener connected", func() bool { return b.Streaming() && l.Connected() })
	before := testmetrics.Value(t, reg, "streamd_wakeup_notifies_total")

	const commits = 300
	subs := make([]*wakeup.Subscription, len(names))
	for i, n := range names {
		subs[i] = l.Subscribe(wakeup.KindStream, n)
		defer subs[i].Close()
	}
	for i := 0; i < commits; i++ {
		_, err := c.Produce(ctx, streams.Record{Stream: names[i%len(names)], Data: []byte(`{}`)})
		require.NoError(t, err)
	}
	for i, s := range subs {
		// Woken after the last commit: a poll of the head sees every commit.
		requireWoken(t, s.C, names[i])
	}
	var tailerTx float64
	testdb.WaitFor(t, 10*time.Second, "tailer handed on every commit", func() bool {
		tailerTx = testmetrics.Value(t, reg, "streamd_tailer_transactions_total")
		return tailerTx >= commits
	})
	sent := testmetrics.Value(t, reg, "streamd_wakeup_notifies_total") - before
	require.Less(t, sent, float64(commits)/3, "notifications are coalesced (%v for %d commits)", sent, commits)
}

// TestMain stops the package's private cluster after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	tailertest.StopShared()
	os.Exit(code)
}

// sharedPool returns a pool on the package's private cluster (see tailertest for
// why not the shared test cluster) and its URL.
func sharedPool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	url := tailertest.Shared(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, url
}

// reader is a consumer's read loop in miniature: read the partition's head through
// SQL, wait with a Waiter (wake-up or poll), and record for each offset whether the
// read that found it followed a wake-up or a poll.
type reader struct {
	via chan string // "wake" or "poll", one per new offset seen
}

func startReader(t *testing.T, pool *pgxpool.Pool, hub *wakeup.Hub, stream string, maxPoll time.Duration) *reader {
	t.Helper()
	sub := hub.Subscribe(wakeup.KindStream, stream)
	w, err := wakeup.NewWaiter(sub, &wakeup.PollOpts{MinInterval: maxPoll, MaxInterval: maxPoll})
	require.NoError(t, err)
	r := &reader{via: make(chan string, 1000)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { // owner: the test; exits at cleanup (cancel)
		defer close(done)
		defer sub.Close()
		var seen int64
		how := "poll"
		for ctx.Err() == nil {
			var head int64
			err := pool.QueryRow(ctx, `SELECT coalesce(max(next_offset), 0) FROM streamd.stream_partitions WHERE stream_name = $1`, stream).Scan(&head)
			if err == nil {
				for ; seen < head; seen++ {
					r.via <- how
				}
			}
			if w.Wait(ctx) {
				how = "wake"
			} else {
				how = "poll"
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// next returns how the next offset was found, failing after d.
func (r *reader) next(t *testing.T, d time.Duration, what string) string {
	t.Helper()
	select {
	case how := <-r.via:
		return how
	case <-time.After(d):
		t.Fatalf("%s: not delivered within %v", what, d)
		return ""
	}
}

func produce(t *testing.T, c *streams.Client, stream string) {
	t.Helper()
	// Producing may fail while the server restarts; retry until it is back.
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := c.Produce(context.Background(), streams.Record{Stream: stream, Data: []byte(`{}`)})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			require.NoError(t, err)
		}
		time.Sleep(20 * time.Millisecond) // retry interval while the server is down
	}
}

// deliveredByWake commits one event at a time until one is delivered by a wake-up
// (or tries run out): wake-ups, unlike polls, come within milliseconds, but a poll
// may occasionally win the race.
func deliveredByWake(t *testing.T, r *reader, c *streams.Client, stream string, tries int) bool {
	t.Helper()
	for i := 0; i < tries; i++ {
		produce(t, c, stream)
		if r.next(t, 20*time.Second, "event") == "wake" {
			return true
		}
	}
	return false
}

// TestRestartDeliversByPollingThenByTailer: on a private cluster, after PostgreSQL
// restarts (immediate shutdown, like a crash), commits are delivered by polling while
// the tailer is down, and by wake-ups again once it has reconnected by itself.
func TestRestartDeliversByPollingThenByTailer(t *testing.T) {
	t.Parallel()
	cl, url := tailertest.Cluster(t, nil)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	c := streams.NewClient(pool, nil)
	stream := testdb.Name("restart")
	require.NoError(t, c.CreateStream(ctx, stream, 1))

	l := fastListener(t, url)
	// The tailer waits seconds before reconnecting, so that the test sees a spell of
	// polling alone; the listener reconnects fast.
	b := fastBroadcaster(t, url, func(c *wakeup.BroadcasterConfig) {
		c.MinBackoff = 8 * time.Second
		c.MaxBackoff = 8 * time.Second
	})
	// A poll of 1 s: a wake-up must beat the reader's next poll to count as one, and
	// under load (a clean-clone CI beside other tests, load 8) the reconnected
	// tailer's first wake-ups took longer than a 150 ms poll five times running.
	const poll = time.Second
	r := startReader(t, pool, l.Hub, stream, poll)
	testdb.WaitFor(t, 30*time.Second, "streaming", func() bool { return b.Streaming() && l.Connected() })
	require.True(t, deliveredByWake(t, r, c, stream, 5), "before the restart, wake-ups deliver")

	require.NoError(t, cl.Restart(ctx, true))
	testdb.WaitFor(t, 30*time.Second, "listener reconnected", l.Connected)
	require.False(t, b.Streaming(), "the tailer waits its backoff before reconnecting")
	polled, stale := 0, 0
	for i := 0; i < 4 && !b.Streaming(); i++ {
		produce(t, c, stream)
		how := r.next(t, 5*time.Second, "event while the tailer is down")
		if b.Streaming() {
			continue
		}
		if how == "wake" && stale == 0 && i == 0 {
			// The listener's reconnect wakes every subscriber (NotifyAll, before it
			// reports Connected); a reader that had not yet taken that wake-up when
			// the first event was committed delivers it by that wake-up. Once only.
			stale++
			continue
		}
		require.Equal(t, "poll", how, "nothing else can deliver while the tailer is down")
		polled++
	}
	require.Positive(t, polled, "some commits were delivered by polling alone")

	testdb.WaitFor(t, 30*time.Second, "tailer streaming again", b.Streaming)
	require.True(t, deliveredByWake(t, r, c, stream, 5), "after reconnecting, the tailer delivers again")
}

// TestWalLevelReplicaPollsOnly: with wal_level=replica the migrations still succeed,
// the tailer says once (log and metric) that it cannot run, and delivery works by
// polling alone.
func TestWalLevelReplicaPollsOnly(t *testing.T) {
	t.Parallel()
	_, url := tailertest.Cluster(t, map[string]string{"wal_level": "replica"})
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	c := streams.NewClient(pool, nil)
	stream := testdb.Name("replica")
	require.NoError(t, c.CreateStream(ctx, stream, 1))

	reg := prometheus.NewRegistry()
	logs := &lineCounter{}
	l := fastListener(t, url)
	b := fastBroadcaster(t, url, func(c *wakeup.BroadcasterConfig) {
		c.Registerer = reg
		c.Logger = logs.logger()
		c.UnsupportedRetry = 30 * time.Millisecond
	})
	testdb.WaitFor(t, 30*time.Second, "tailer gives up, listener connected", func() bool { return b.Unsupported() && l.Connected() })
	r := startReader(t, pool, l.Hub, stream, 50*time.Millisecond)
	for i := 0; i < 5; i++ {
		produce(t, c, stream)
		require.Equal(t, "poll", r.next(t, 5*time.Second, "event"), "only polling can deliver")
	}
	require.Equal(t, 1.0, testmetrics.Value(t, reg, "streamd_tailer_fallback_polling", "reason", "wal_level"))
	require.Equal(t, 0.0, testmetrics.Value(t, reg, "streamd_tailer_connected"))
	require.Equal(t, 1, logs.count("wake-ups come from polling only"), "said once, though retried many times")
	require.False(t, b.Streaming())
}

// lineCounter counts log lines by message.
type lineCounter struct {
	buf testdb.Buffer
}

func (l *lineCounter) count(substr string) int { return strings.Count(l.buf.String(), substr) }

// TestBroadcasterRunsAgain: streamd's leader runs the Broadcaster once per
// leadership term; after Run returned, a second Run streams and wakes again.
func TestBroadcasterRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, url := sharedPool(t)
	c := streams.NewClient(pool, nil)
	stream := testdb.Name("terms")
	require.NoError(t, c.CreateStream(ctx, stream, 1))
	hub := wakeup.NewHub()
	b, err := wakeup.NewBroadcaster(&wakeup.BroadcasterConfig{ConnString: url, Hub: hub, NoNotify: true,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	sub := hub.SubscribePartition(stream, 0)
	defer sub.Close()
	for term := 1; term <= 2; term++ {
		tctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- b.Run(tctx) }() // owner: this test; exits at cancel below
		testdb.WaitFor(t, 90*time.Second, "streaming", b.Streaming)
		drain(sub.C)
		_, err := c.Produce(ctx, streams.Record{Stream: stream, Data: []byte(`{}`)})
		require.NoError(t, err)
		requireWoken(t, sub.C, fmt.Sprintf("term %d", term))
		cancel()
		require.NoError(t, <-done)
		require.False(t, b.Streaming())
	}
}
