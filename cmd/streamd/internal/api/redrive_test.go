package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/cmd/streamd/internal/coordinator"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// deadLetters makes a queue and its dead-letter queue (named from prefix) and puts n
// messages, sent to the queue and termed, in the dead-letter queue.
func deadLetters(t *testing.T, ctx context.Context, pool *pgxpool.Pool, prefix string, n int) (q, dlq string) {
	t.Helper()
	mc, err := messages.NewClient(pool, nil)
	require.NoError(t, err)
	q, dlq = testdb.Name(prefix), testdb.Name(prefix+"-dlq")
	require.NoError(t, mc.CreateQueue(ctx, dlq, nil))
	require.NoError(t, mc.CreateQueue(ctx, q, &messages.QueueConfig{DeadLetterQueue: dlq}))
	for i := 0; i < n; i++ {
		_, err := mc.Send(ctx, q, messages.OutgoingMessage{Data: json.RawMessage(fmt.Sprint(i))})
		require.NoError(t, err)
	}
	got, err := mc.Receive(ctx, q, &messages.ReceiveOpts{Max: n})
	require.NoError(t, err)
	require.Len(t, got, n)
	for _, m := range got {
		require.NoError(t, mc.Term(ctx, "poison", m.Receipt))
	}
	return q, dlq
}

// TestRedriveTask: a redrive task created through the API is run by the leader's
// redrive service, moves exactly max_messages dead letters back, and finishes.
func TestRedriveTask(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, sc := newServer(t)
	pool := sc.Pool()
	q, dlq := deadLetters(t, ctx, pool, "rq", 5)
	depth := func(name string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.messages WHERE stream_name = $1", name).Scan(&n))
		return n
	}
	require.Equal(t, 5, depth(dlq))

	code, body := c.do("POST", "/v1/queues/"+dlq+"/redrive-tasks", adminToken, `{"rate":-1}`)
	require.Equal(t, http.StatusBadRequest, code, "%v", body)
	code, body = c.do("POST", "/v1/queues/no-such-"+dlq+"/redrive-tasks", adminToken, `{}`)
	require.Equal(t, http.StatusNotFound, code, "%v", body)
	code, body = c.do("POST", "/v1/queues/"+dlq+"/redrive-tasks", adminToken, `{"rate":200,"max_messages":3}`)
	require.Equal(t, http.StatusAccepted, code, "%v", body)
	id := int64(body["id"].(float64))

	svc := coordinator.Redrive(pool, nil, 20*time.Millisecond)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(rctx) }()
	require.Eventually(t, func() bool {
		var status string
		require.NoError(t, pool.QueryRow(ctx, "SELECT status FROM streamd.redrive_tasks WHERE dlq = $1 AND id = $2", dlq, id).Scan(&status))
		return status == "done"
	}, 20*time.Second, 20*time.Millisecond)
	stop()
	require.NoError(t, <-done)
	require.Equal(t, 3, depth(q), "exactly max_messages moved back")
	require.Equal(t, 2, depth(dlq))

	code, body = c.do("GET", "/v1/redrive-tasks?status=done", adminToken, "")
	require.Equal(t, http.StatusOK, code)
	raw, _ := json.Marshal(body)
	require.Contains(t, string(raw), `"moved":3`)
	code, _ = c.do("DELETE", fmt.Sprintf("/v1/queues/%s/redrive-tasks/%d", dlq, id), adminToken, "")
	require.Equal(t, http.StatusNotFound, code, "a finished task cannot be canceled")

	// max_messages 0 is the dead letters there now (2), recorded in the task.
	code, body = c.do("POST", "/v1/queues/"+dlq+"/redrive-tasks", adminToken, `{}`)
	require.Equal(t, http.StatusAccepted, code, "%v", body)
	require.EqualValues(t, 2, body["max_messages"], "%v", body)

	// On an empty dead-letter queue it is done at once: dead letters that arrive
	// before the leader's first step are not "there now". It used to record 0, which
	// the step reads as no bound, and moved them.
	_, empty := deadLetters(t, ctx, pool, "rqe", 0)
	code, body = c.do("POST", "/v1/queues/"+empty+"/redrive-tasks", adminToken, `{}`)
	require.Equal(t, http.StatusAccepted, code, "%v", body)
	require.Equal(t, "done", body["status"], "%v", body)
	var moved *int32
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.redrive_task_step($1, $2, 1000)", empty, int64(body["id"].(float64))).Scan(&moved))
	require.Nil(t, moved, "a finished task moves nothing")
}

// TestRedriveTaskKeepsLowRates: a task at 2 messages a second moves about that many,
// whatever the tick (it moved at least one per tick: 50 a second at a 20 ms tick).
func TestRedriveTaskKeepsLowRates(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, sc := newServer(t)
	pool := sc.Pool()
	q, dlq := deadLetters(t, ctx, pool, "rl", 10)
	code, body := c.do("POST", "/v1/queues/"+dlq+"/redrive-tasks", adminToken, `{"rate":2}`)
	require.Equal(t, http.StatusAccepted, code, "%v", body)
	// The task stays open when the test stops the service: cancel it, or open tasks
	// pile up in the test database and the service (which takes the oldest 100) no
	// longer reaches later tests' tasks.
	id := int64(body["id"].(float64))
	t.Cleanup(func() {
		c.do("DELETE", fmt.Sprintf("/v1/queues/%s/redrive-tasks/%d", dlq, id), adminToken, "")
	})

	svc := coordinator.Redrive(pool, nil, 20*time.Millisecond)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- svc.Run(rctx) }()
	// Wait until 3 moved (at 2 a second, about a second), then check how long it took.
	var moved int
	require.Eventually(t, func() bool {
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.messages WHERE stream_name = $1", q).Scan(&moved))
		return moved >= 3
	}, 20*time.Second, 20*time.Millisecond)
	stop()
	require.NoError(t, <-done)
	limit := int(2*time.Since(start).Seconds()) + 2 // the rate, plus a second's worth of credit
	require.GreaterOrEqual(t, moved, 1)
	require.LessOrEqual(t, moved, limit, "moved %d in %v at 2/s", moved, time.Since(start))
}

// TestRedriveTaskSurvivesAPassingError: a step that fails for a passing reason (here a
// statement timeout behind another transaction's lock on the task) is tried again on a
// later tick and the task finishes; it used to be marked failed for good.
func TestRedriveTaskSurvivesAPassingError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, sc := newServer(t)
	pool := sc.Pool()
	_, dlq := deadLetters(t, ctx, pool, "rp", 3)
	code, body := c.do("POST", "/v1/queues/"+dlq+"/redrive-tasks", adminToken, `{}`)
	require.Equal(t, http.StatusAccepted, code, "%v", body)
	id := int64(body["id"].(float64))

	blocker, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, "SELECT 1 FROM streamd.redrive_tasks WHERE dlq = $1 AND id = $2 FOR UPDATE", dlq, id)
	require.NoError(t, err)

	cfg := testdb.Config(t)
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "100ms"
	svcPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer svcPool.Close()
	logs := testdb.NewLogs()
	svc := coordinator.Redrive(svcPool, logs.Logger(), 20*time.Millisecond)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(rctx) }()
	// Steps time out behind the lock, and are tried again: two are observed.
	logs.WaitFor(t, "redrive task step failed; trying again", 2)
	require.NoError(t, blocker.Rollback(ctx))
	status := func() string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, "SELECT status FROM streamd.redrive_tasks WHERE dlq = $1 AND id = $2", dlq, id).Scan(&s))
		return s
	}
	require.Eventually(t, func() bool { return status() == "done" }, 20*time.Second, 20*time.Millisecond, "status %s", status())
	stop()
	require.NoError(t, <-done)
}
