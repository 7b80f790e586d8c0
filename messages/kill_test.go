package messages_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// The child worker process of TestWorkerKill9: the parent re-runs this test binary
// with these variables set.
const (
	childQueueEnv = "STREAMD_MESSAGES_CHILD_QUEUE"
	childTableEnv = "STREAMD_MESSAGES_CHILD_TABLE"
	childReady    = "streamd-worker-ready"
	// childLeaseEnv is the worker's visibility timeout (default 500ms: the leases of
	// killed workers expire quickly).
	childLeaseEnv = "STREAMD_MESSAGES_CHILD_LEASE"
)

// TestWorkerKill9Child is not a test on its own: it returns at once unless
// TestWorkerKill9 or TestWorkerSIGTERMSpendsNoAttempt started this process as a
// worker. The worker's handler records each message in the parent's table and acks it
// in the same transaction (AckTx), so the table holds exactly the acks that committed.
// SIGTERM stops it cleanly (Work's ctx ends); it then exits 0.
func TestWorkerKill9Child(t *testing.T) {
	queue, table := os.Getenv(childQueueEnv), os.Getenv(childTableEnv)
	if queue == "" {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fmt.Println(childReady) // the parent may stop this worker with SIGTERM from now on
	pool := testdb.Pool(t)
	c, err := messages.NewClient(pool, &messages.ClientConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	insert := "INSERT INTO " + pgx.Identifier{table}.Sanitize() + " (message_id, attempt, pid) VALUES ($1, $2, $3)"
	pid := os.Getpid()
	lease := 500 * time.Millisecond
	if d, err := time.ParseDuration(os.Getenv(childLeaseEnv)); err == nil {
		lease = d
	}
	err = c.Work(ctx, queue, &messages.WorkerConfig{
		Concurrency: 4, VisibilityTimeout: lease, PollWait: 200 * time.Millisecond,
		Backoff: func(int) time.Duration { return 0 },
	}, func(ctx context.Context, m *messages.Message) error {
		time.Sleep(time.Duration(rand.IntN(15)) * time.Millisecond) // work, so kills and stops land mid-handler
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, insert, m.MessageID, m.DeliveryAttempts, pid); err != nil {
				return err
			}
			err := c.AckTx(ctx, tx, m.Receipt)
			if errors.Is(err, messages.ErrLeaseLost) {
				return err // roll back: someone else holds the message now
			}
			return err
		})
	})
	require.NoError(t, err)
}

// startWorkerChild starts a worker process (TestWorkerKill9Child) on queue, acking
// into table.
func startWorkerChild(t *testing.T, queue, table string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestWorkerKill9Child$", "-test.count", "1")
	cmd.Env = append(os.Environ(), childQueueEnv+"="+queue, childTableEnv+"="+table, "STREAMD_DATABASE_URL="+testdb.URL(t))
	require.NoError(t, cmd.Start())
	return cmd
}

// countRows returns how many rows table holds (the acks the workers committed).
func countRows(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var k int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&k))
	return k
}

// Q1 with crashes: worker processes are killed with SIGKILL (mid-handler, mid-
// transaction) and replaced while they drain a queue. Every message is acked exactly
// once (the ack commits with the handler's record) and none is lost: the leases of
// the killed workers expire and their messages are redelivered.
func TestWorkerKill9(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	q := newQueue(t, pool, &messages.QueueConfig{VisibilityTimeout: 500 * time.Millisecond, MaxDeliveryAttempts: 1000})
	c := newClient(t, pool, nil)
	table := strings.ReplaceAll(testdb.Name("msg_kill_acks"), "-", "_")
	_, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{table}.Sanitize()+" (message_id text NOT NULL, attempt int NOT NULL, pid int NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	})

	const n = 600
	var batch []messages.OutgoingMessage
	for i := range n {
		batch = append(batch, messages.OutgoingMessage{Data: data(i), MessageID: fmt.Sprintf("k-%04d", i)})
	}
	_, err = c.Send(ctx, q, batch...)
	require.NoError(t, err)

	start := func() *exec.Cmd { return startWorkerChild(t, q, table) }
	children := []*exec.Cmd{start(), start(), start()}
	defer func() {
		for _, ch := range children {
			_ = ch.Process.Kill()
			_ = ch.Wait()
		}
	}()
	acks := func() int { return countRows(t, pool, table) }
	// Kill a random worker every time another slice of the queue is acked, until
	// three quarters are done; then let the survivors finish.
	rng := rand.New(rand.NewPCG(4, 4))
	kills := 0
	deadline := time.Now().Add(60 * time.Second)
	for next := n / 8; next < 3*n/4 && time.Now().Before(deadline); {
		if acks() < next {
			time.Sleep(10 * time.Millisecond) // polling a condition
			continue
		}
		i := rng.IntN(len(children))
		require.NoError(t, children[i].Process.Signal(os.Kill))
		_ = children[i].Wait()
		children[i] = start()
		kills++
		next += n / 8
	}
	waitEmpty(t, pool, q, 60*time.Second)

	rows, err := pool.Query(ctx, "SELECT message_id, count(*), max(attempt) FROM "+pgx.Identifier{table}.Sanitize()+" GROUP BY message_id")
	require.NoError(t, err)
	got := map[string]int{}
	redelivered := 0
	for rows.Next() {
		var id string
		var k, maxAttempt int
		require.NoError(t, rows.Scan(&id, &k, &maxAttempt))
		got[id] = k
		if maxAttempt > 1 {
			redelivered++
		}
	}
	require.NoError(t, rows.Err())
	require.GreaterOrEqual(t, kills, 5)
	require.Len(t, got, n, "every message acked")
	for id, k := range got {
		require.Equal(t, 1, k, "message %s acked %d times", id, k)
	}
	t.Logf("%d kills, %d messages redelivered after a kill", kills, redelivered)
}

// TestWorkerSIGTERMSpendsNoAttempt (issue 16): worker processes are stopped with
// SIGTERM, again and again, while they drain a queue whose messages have one
// delivery attempt and a dead-letter queue. A clean stop lets the running handlers
// finish and releases what it will not handle, so no message is dead-lettered, each
// is acked exactly once, and each at its first delivery. Work used to cancel its
// handlers and nack their messages at every stop: one attempt spent each, so here
// dead-lettered.
func TestWorkerSIGTERMSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	dlq := newQueue(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{DeadLetterQueue: dlq, MaxDeliveryAttempts: 1, VisibilityTimeout: 30 * time.Second})
	c := newClient(t, pool, nil)
	table := strings.ReplaceAll(testdb.Name("msg_term_acks"), "-", "_")
	_, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{table}.Sanitize()+" (message_id text NOT NULL, attempt int NOT NULL, pid int NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	})
	send := func(from, n int) {
		var batch []messages.OutgoingMessage
		for i := from; i < from+n; i++ {
			batch = append(batch, messages.OutgoingMessage{Data: data(i), MessageID: fmt.Sprintf("k-%04d", i)})
		}
		_, err := c.Send(ctx, q, batch...)
		require.NoError(t, err)
	}
	const n = 400
	send(0, n/2)

	type child struct {
		cmd   *exec.Cmd
		ready chan struct{} // closed when it printed childReady
		done  chan error
	}
	start := func() *child {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestWorkerKill9Child$", "-test.count", "1")
		// A long lease: no lease may expire here (a message whose lease expired at its
		// one attempt is dead-lettered, which a slow machine must not mistake for a
		// stop's doing); an abandoned message shows as a queue that never empties.
		cmd.Env = append(os.Environ(), childQueueEnv+"="+q, childTableEnv+"="+table, childLeaseEnv+"=1m",
			"STREAMD_DATABASE_URL="+testdb.URL(t))
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		ch := &child{cmd: cmd, ready: make(chan struct{}), done: make(chan error, 1)}
		scanned := make(chan struct{})
		go func() { // owner: the child; ends at its stdout's EOF
			defer close(scanned)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if sc.Text() == childReady {
					close(ch.ready)
				}
			}
		}()
		go func() { <-scanned; ch.done <- cmd.Wait() }() // Wait after the reads (os/exec's rule)
		return ch
	}
	children := []*child{start(), start()}
	defer func() {
		for _, ch := range children {
			_ = ch.cmd.Process.Kill()
			<-ch.done
		}
	}()
	acks := func() int { return countRows(t, pool, table) }
	// Stop a worker with SIGTERM each time another slice of the queue is acked (the
	// other half of the messages is sent meanwhile), and start a new one.
	rng := rand.New(rand.NewPCG(16, 3))
	stops := 0
	deadline := time.Now().Add(60 * time.Second)
	for next := n / 12; next < 5*n/6 && time.Now().Before(deadline); {
		if acks() < next {
			time.Sleep(5 * time.Millisecond) // polling a condition
			continue
		}
		if stops == 2 {
			send(n/2, n/2)
		}
		i := rng.IntN(len(children))
		// Once it handles SIGTERM (a fresh process killed by SIGTERM before it
		// installed its handler would prove nothing).
		select {
		case <-children[i].ready:
		case <-time.After(30 * time.Second):
			t.Fatal("a worker did not start within 30s")
		}
		require.NoError(t, children[i].cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-children[i].done:
			require.NoError(t, err, "a worker stopped with SIGTERM exits 0")
		case <-time.After(30 * time.Second):
			t.Fatal("a worker did not stop within 30s of SIGTERM")
		}
		children[i] = start()
		stops++
		next += n / 12
	}
	waitEmpty(t, pool, q, 60*time.Second)

	require.GreaterOrEqual(t, stops, 8)
	if dead, err := c.Peek(ctx, dlq, nil); err == nil {
		for _, m := range dead {
			t.Logf("dead letter %s: attempts %d, last error %q", m.MessageID, m.Origin.Attempts, m.LastError)
		}
	}
	require.Zero(t, count(t, pool, dlq), "clean stops dead-lettered messages")
	rows, err := pool.Query(ctx, "SELECT message_id, count(*), max(attempt) FROM "+pgx.Identifier{table}.Sanitize()+" GROUP BY message_id")
	require.NoError(t, err)
	got := map[string]int{}
	for rows.Next() {
		var id string
		var k, maxAttempt int
		require.NoError(t, rows.Scan(&id, &k, &maxAttempt))
		got[id] = k
		require.Equal(t, 1, maxAttempt, "message %s acked at a later attempt: a clean stop spent one", id)
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, n, "every message acked")
	for id, k := range got {
		require.Equal(t, 1, k, "message %s acked %d times", id, k)
	}
	t.Logf("%d clean stops", stops)
}
