package messages_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

func ptr[T any](v T) *T { return &v }

// TestSetQueueChangesOnlyTheGivenSettings: SetQueue creates a queue with the defaults
// for what it does not give, changes only the given settings of an existing one (the
// dead-letter queue is kept unless given; "" removes it), refuses bad values naming
// them with nothing written, and two concurrent calls that change different settings
// both take effect (a read-then-write lost one of them).
func TestSetQueueChangesOnlyTheGivenSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	dlq := newQueue(t, pool, nil)
	name := testdb.Name("set")

	q, err := c.SetQueue(ctx, name, &messages.QueueUpdate{DeadLetterQueue: ptr(dlq)})
	require.NoError(t, err)
	require.Equal(t, name, q.Name)
	require.Equal(t, dlq, q.DeadLetterQueue)
	require.Equal(t, 5, q.MaxDeliveryAttempts)
	require.Equal(t, 262144, q.MaxPayloadBytes)
	require.Equal(t, 30*time.Second, q.VisibilityTimeout)

	q, err = c.SetQueue(ctx, name, &messages.QueueUpdate{MaxDeliveryAttempts: ptr(9)})
	require.NoError(t, err)
	require.Equal(t, 9, q.MaxDeliveryAttempts)
	require.Equal(t, dlq, q.DeadLetterQueue, "kept")

	for _, u := range []*messages.QueueUpdate{
		{MaxDeliveryAttempts: ptr(0)},
		{MaxPayloadBytes: ptr(64<<20 + 1)},
		{VisibilityTimeout: ptr(time.Microsecond)},
		{DeadLetterQueue: ptr(name)},
		{FIFO: ptr(true)},
		{DeadLetterQueue: ptr(testdb.Name("missing"))},
	} {
		_, err := c.SetQueue(ctx, name, u)
		require.Error(t, err, "%+v", u)
	}
	_, err = c.SetQueue(ctx, "bad name", nil)
	require.ErrorIs(t, err, messages.ErrInvalidName)
	got, err := c.GetQueue(ctx, name)
	require.NoError(t, err)
	require.Equal(t, 9, got.MaxDeliveryAttempts, "nothing written")
	require.Equal(t, dlq, got.DeadLetterQueue)
	require.False(t, got.FIFO)

	// Concurrent partial updates of different settings both take effect: the second
	// waits for the first (uncommitted here) and reads its result. Without the
	// serialisation it read the settings before the first and wrote them back.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT streamd.queue_set($1, NULL, NULL, 11, false, NULL, NULL)", name)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := c.SetQueue(ctx, name, &messages.QueueUpdate{MaxPayloadBytes: ptr(1001)})
		done <- err
	}()
	testdb.WaitForLockWait(t, pool, tx, "queue_set")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)
	got, err = c.GetQueue(ctx, name)
	require.NoError(t, err)
	require.Equal(t, 11, got.MaxDeliveryAttempts, "the first update is kept")
	require.Equal(t, 1001, got.MaxPayloadBytes)

	q, err = c.SetQueue(ctx, name, &messages.QueueUpdate{DeadLetterQueue: ptr("")})
	require.NoError(t, err)
	require.Empty(t, q.DeadLetterQueue, "removed")
}

// TestRedriveTasks: a task records the dead letters there when it is created, is
// listed (by status too), moves them step by step and finishes; a canceled or failed
// task is closed and a second cancel is ErrRedriveTaskNotFound; bad input writes
// nothing.
func TestRedriveTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	c := newClient(t, pool, nil)
	dlq := newQueue(t, pool, nil)
	q := newQueue(t, pool, &messages.QueueConfig{DeadLetterQueue: dlq})
	for i := 0; i < 3; i++ {
		_, err := c.Send(ctx, q, messages.OutgoingMessage{Data: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	got, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: 3})
	require.NoError(t, err)
	for _, m := range got {
		require.NoError(t, c.Term(ctx, "poison", m.Receipt))
	}

	_, err = c.CreateRedriveTask(ctx, dlq, &messages.RedriveTaskOpts{Rate: -1})
	require.ErrorIs(t, err, messages.ErrInvalidArgument)
	_, err = c.CreateRedriveTask(ctx, testdb.Name("missing"), nil)
	require.ErrorIs(t, err, messages.ErrQueueNotFound)
	_, err = c.ListRedriveTasks(ctx, "bogus")
	require.ErrorIs(t, err, messages.ErrInvalidArgument)

	task, err := c.CreateRedriveTask(ctx, dlq, &messages.RedriveTaskOpts{CreatedBy: "ops", Rate: 5})
	require.NoError(t, err)
	require.Equal(t, messages.RedriveTaskPending, task.Status)
	require.EqualValues(t, 3, task.MaxMessages, "the dead letters there now")
	require.Equal(t, "ops", *task.CreatedBy)
	pending, err := c.ListRedriveTasks(ctx, messages.RedriveTaskPending)
	require.NoError(t, err)
	require.Contains(t, ids(pending), task.ID)
	open, err := c.OpenRedriveTasks(ctx, 1000)
	require.NoError(t, err)
	require.Contains(t, ids(open), task.ID)

	moved, ok, err := c.StepRedriveTask(ctx, dlq, task.ID, 2)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 2, moved)
	moved, ok, err = c.StepRedriveTask(ctx, dlq, task.ID, 2)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 1, moved, "max_messages reached")
	moved, _, err = c.StepRedriveTask(ctx, dlq, task.ID, 2)
	require.NoError(t, err)
	require.Zero(t, moved, "nothing left: the step finishes the task")
	_, ok, err = c.StepRedriveTask(ctx, dlq, task.ID, 2)
	require.NoError(t, err)
	require.False(t, ok, "done")
	_, err = c.CancelRedriveTask(ctx, dlq, task.ID)
	require.ErrorIs(t, err, messages.ErrRedriveTaskNotFound, "a done task cannot be canceled")

	empty, err := c.CreateRedriveTask(ctx, dlq, nil)
	require.NoError(t, err)
	require.Equal(t, messages.RedriveTaskDone, empty.Status, "nothing to move")

	second, err := c.CreateRedriveTask(ctx, dlq, &messages.RedriveTaskOpts{MaxMessages: 10})
	require.NoError(t, err)
	canceled, err := c.CancelRedriveTask(ctx, dlq, second.ID)
	require.NoError(t, err)
	require.Equal(t, messages.RedriveTaskCanceled, canceled.Status)
	_, err = c.CancelRedriveTask(ctx, dlq, second.ID)
	require.ErrorIs(t, err, messages.ErrRedriveTaskNotFound)

	third, err := c.CreateRedriveTask(ctx, dlq, &messages.RedriveTaskOpts{MaxMessages: 10})
	require.NoError(t, err)
	require.NoError(t, c.FailRedriveTask(ctx, dlq, third.ID, "broken"))
	failed, err := c.ListRedriveTasks(ctx, messages.RedriveTaskFailed)
	require.NoError(t, err)
	for _, f := range failed {
		if f.ID == third.ID {
			require.Equal(t, "broken", *f.Error)
		}
	}
	require.Contains(t, ids(failed), third.ID)
}

func ids(ts []messages.RedriveTask) []int64 {
	out := make([]int64, len(ts))
	for i, t := range ts {
		out[i] = t.ID
	}
	return out
}
