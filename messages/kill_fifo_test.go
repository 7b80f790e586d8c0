package messages_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// Q1 and the FIFO guarantees with crashes and a frozen worker: worker processes drain a
// FIFO queue of 20 groups; one is frozen (SIGSTOP) holding its leases while the others
// go on, and workers are killed with SIGKILL and replaced. The frozen worker's groups
// come back once their leases end (a group in flight is read past until its lease_end,
// session 12), and it is let go again (SIGCONT), its late acks refused. Every message
// is acked exactly once, and within each group in the order sent: the acks' commit
// order (a serial taken in the acking transaction) follows the send order, which two
// messages of a group in flight at once, or a group served again before its lease
// ended, would break.
func TestFIFOWorkerKill9AndStop(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	pool := testdb.Pool(t)
	q := newQueue(t, pool, &messages.QueueConfig{FIFO: true, VisibilityTimeout: 500 * time.Millisecond, MaxDeliveryAttempts: 1000})
	c := newClient(t, pool, nil)
	table := strings.ReplaceAll(testdb.Name("msg_fifo_kill_acks"), "-", "_")
	_, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{table}.Sanitize()+
		" (seq bigserial, message_id text NOT NULL, attempt int NOT NULL, pid int NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	})
	const n, groups = 400, 20
	var batch []messages.OutgoingMessage
	for i := range n {
		batch = append(batch, messages.OutgoingMessage{Data: data(i), MessageID: fmt.Sprintf("g%02d-%04d", i%groups, i),
			GroupKey: fmt.Sprintf("g%02d", i%groups)})
	}
	_, err = c.Send(ctx, q, batch...)
	require.NoError(t, err)

	start := func() *exec.Cmd { return startWorkerChild(t, q, table) }
	children := []*exec.Cmd{start(), start(), start()}
	frozen := children[0]
	defer func() {
		_ = frozen.Process.Signal(syscall.SIGCONT)
		for _, ch := range children {
			_ = ch.Process.Kill()
			_ = ch.Wait()
		}
	}()
	acks := func() int { return countRows(t, pool, table) }
	waitAcks := func(k int, what string) {
		testdb.WaitFor(t, 60*time.Second, what, func() bool { return acks() >= k })
	}

	// Freeze a worker once it has acked, so it holds leases of its own; the others
	// must go on past the groups it holds (their leases end).
	var frozenAcks int
	testdb.WaitFor(t, 60*time.Second, "the worker to freeze to ack", func() bool {
		return pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()+" WHERE pid = $1",
			frozen.Process.Pid).Scan(&frozenAcks) == nil && frozenAcks > 0
	})
	testdb.StopProcess(t, frozen.Process.Pid)
	waitAcks(acks()+n/4, "the other workers to ack a quarter of the queue with one worker frozen")
	require.NoError(t, frozen.Process.Signal(syscall.SIGCONT))

	// Kill a random worker (the thawed one among them) every time another slice is
	// acked, until three quarters are done; then let the survivors finish.
	rng := rand.New(rand.NewPCG(8, 21))
	kills := 0
	for next := acks() + n/10; next < 3*n/4; next += n / 10 {
		waitAcks(next, "another slice of the queue acked")
		i := rng.IntN(len(children))
		require.NoError(t, children[i].Process.Signal(os.Kill))
		_ = children[i].Wait()
		children[i] = start()
		kills++
	}
	waitEmpty(t, pool, q, 60*time.Second)

	rows, err := pool.Query(ctx, "SELECT message_id FROM "+pgx.Identifier{table}.Sanitize()+" ORDER BY seq")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, ids, n, "every message acked once (%d acks)", len(ids))
	seen := map[string]bool{}
	last := map[string]string{} // group -> its last acked message id
	for _, id := range ids {
		require.False(t, seen[id], "message %s acked twice", id)
		seen[id] = true
		g := id[:3]
		require.Less(t, last[g], id, "group %s: %s acked after %s", g, id, last[g])
		last[g] = id
	}
	t.Logf("%d kills; the frozen worker had acked %d before its stop", kills, frozenAcks)
}
