package messages_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// The child worker process of TestWorkerKill9: the parent re-runs this test binary
// with these variables set.
const (
	childQueueEnv = "STREAMD_MESSAGES_CHILD_QUEUE"
	childTableEnv = "STREAMD_MESSAGES_CHILD_TABLE"
)

// TestWorkerKill9Child is not a test on its own: it returns at once unless
// TestWorkerKill9 started this process as a worker. The worker's handler records
// each message in the parent's table and acks it in the same transaction (AckTx), so
// the table holds exactly the acks that committed.
func TestWorkerKill9Child(t *testing.T) {
	queue, table := os.Getenv(childQueueEnv), os.Getenv(childTableEnv)
	if queue == "" {
		return
	}
	pool := testdb.Pool(t)
	c, err := messages.NewClient(pool, &messages.ClientConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	insert := "INSERT INTO " + pgx.Identifier{table}.Sanitize() + " (message_id, attempt, pid) VALUES ($1, $2, $3)"
	pid := os.Getpid()
	err = c.Work(context.Background(), queue, &messages.WorkerConfig{
		Concurrency: 4, VisibilityTimeout: 500 * time.Millisecond, PollWait: 200 * time.Millisecond,
		Backoff: func(int) time.Duration { return 0 },
	}, func(ctx context.Context, m *messages.Message) error {
		time.Sleep(time.Duration(rand.IntN(15)) * time.Millisecond) // work, so kills land mid-handler
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

	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestWorkerKill9Child$", "-test.count", "1")
		cmd.Env = append(os.Environ(), childQueueEnv+"="+q, childTableEnv+"="+table, "STREAMD_DATABASE_URL="+testdb.URL(t))
		require.NoError(t, cmd.Start())
		return cmd
	}
	children := []*exec.Cmd{start(), start(), start()}
	defer func() {
		for _, ch := range children {
			_ = ch.Process.Kill()
			_ = ch.Wait()
		}
	}()
	acks := func() int {
		var k int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&k))
		return k
	}
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
