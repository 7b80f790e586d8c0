package consumergroup

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestResetOffsets: each mode computes the documented offset (clamped to the log);
// a group with a live member is refused (ErrGroupNotEmpty) and unchanged unless
// forced, and a forced reset fences the member; bad input writes nothing.
func TestResetOffsets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 10)
	mid := time.Now()
	produce(t, pool, stream, 10, 10)
	admin := NewAdmin(pool)

	_, err := admin.ResetOffsets(ctx, stream, group, ResetOpts{Mode: ResetToEarliest})
	require.ErrorIs(t, err, ErrGroupNotFound)

	m := join(t, pool, stream, group, "a")
	_, err = m.heartbeat(ctx, pool, nil)
	require.NoError(t, err)
	require.NoError(t, m.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 5}}, nil))
	_, err = admin.ResetOffsets(ctx, stream, group, ResetOpts{Mode: ResetToLatest})
	require.ErrorIs(t, err, ErrGroupNotEmpty)
	off, _, err := committedOffset(ctx, pool, stream, group, 0)
	require.NoError(t, err)
	require.EqualValues(t, 5, off, "a refused reset changes nothing")

	changes, err := admin.ResetOffsets(ctx, stream, group, ResetOpts{Mode: ResetToLatest, Force: true})
	require.NoError(t, err)
	require.Len(t, changes, 1)
	require.EqualValues(t, 5, *changes[0].Previous)
	require.EqualValues(t, 20, changes[0].New)
	require.ErrorIs(t, m.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 6}}, nil), ErrFenced,
		"a forced reset expels the live member")

	for _, tc := range []struct {
		opts ResetOpts
		want int64
	}{
		{ResetOpts{Mode: ResetToEarliest}, 0},
		{ResetOpts{Mode: ResetToOffset, Value: 7}, 7},
		{ResetOpts{Mode: ResetShiftBy, Value: 5}, 12},
		{ResetOpts{Mode: ResetShiftBy, Value: -100}, 0},
		{ResetOpts{Mode: ResetToOffset, Value: 1000}, 20},
		{ResetOpts{Mode: ResetToTimestamp, Time: mid}, 10},
	} {
		changes, err := admin.ResetOffsets(ctx, stream, group, tc.opts)
		require.NoError(t, err, tc.opts.Mode)
		require.EqualValues(t, tc.want, changes[0].New, tc.opts)
	}
	for _, bad := range []ResetOpts{{Mode: "sideways"}, {Mode: ResetToOffset, Value: -1}, {Mode: ResetToEarliest, Partitions: []int32{3}}} {
		_, err := admin.ResetOffsets(ctx, stream, group, bad)
		require.ErrorIs(t, err, ErrInvalidArgument, bad)
	}
	off, _, err = committedOffset(ctx, pool, stream, group, 0)
	require.NoError(t, err)
	require.EqualValues(t, 10, off, "bad resets change nothing")

	d, err := admin.DescribeGroup(ctx, stream, group)
	require.NoError(t, err)
	require.EqualValues(t, 10, d.Lag)
	require.NoError(t, admin.DeleteGroup(ctx, stream, group, false))
	require.ErrorIs(t, admin.DeleteGroup(ctx, stream, group, false), ErrGroupNotFound)
}

// TestResetShiftByClampsAtTheInt64Edges: a shift as large as an int64 goes (say
// "to the end": math.MaxInt64) is clamped to the stored log as documented; the sum
// overflowed bigint and the reset failed with an untyped error.
func TestResetShiftByClampsAtTheInt64Edges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 3)
	m := join(t, pool, stream, group, "a")
	_, err := m.heartbeat(ctx, pool, nil)
	require.NoError(t, err)
	require.NoError(t, m.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 1}}, nil))
	_, err = m.leave(ctx, pool, nil)
	require.NoError(t, err)
	admin := NewAdmin(pool)
	for _, tc := range []struct {
		shift int64
		want  int64
	}{{math.MaxInt64, 3}, {math.MinInt64, 0}, {math.MaxInt64 - 1, 3}, {math.MinInt64 + 1, 0}} {
		changes, err := admin.ResetOffsets(ctx, stream, group, ResetOpts{Mode: ResetShiftBy, Value: tc.shift})
		require.NoError(t, err, "shift by %d", tc.shift)
		require.Len(t, changes, 1)
		require.Equal(t, tc.want, changes[0].New, "shift by %d", tc.shift)
	}
}

// TestResetNoPartitionsExpelsNobody: ResetOpts.Partitions empty (not nil) names no
// partition: nothing is reset and, even forced, the live members stay. A forced
// reset of nothing expelled them.
func TestResetNoPartitionsExpelsNobody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	produce(t, pool, stream, 0, 3)
	m := join(t, pool, stream, group, "a")
	_, err := m.heartbeat(ctx, pool, nil)
	require.NoError(t, err)
	require.NoError(t, m.commit(ctx, pool, []PartitionOffset{{Partition: 0, Offset: 1}}, nil))

	changes, err := NewAdmin(pool).ResetOffsets(ctx, stream, group, ResetOpts{Mode: ResetToLatest, Partitions: []int32{}, Force: true})
	require.NoError(t, err)
	require.Empty(t, changes)
	_, err = m.heartbeat(ctx, pool, nil)
	require.NoError(t, err, "the member was not expelled")
	off, _, err := committedOffset(ctx, pool, stream, group, 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, off, "nothing was reset")
}

// TestDeleteGroupRejectsInvalidGroupID: a malformed group id is ErrInvalidGroupID, as
// for every other group call, not ErrGroupNotFound.
func TestDeleteGroupRejectsInvalidGroupID(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	err := NewAdmin(pool).DeleteGroup(context.Background(), stream, "no spaces allowed", true)
	require.ErrorIs(t, err, ErrInvalidGroupID)
	require.NotErrorIs(t, err, ErrGroupNotFound)
}

// TestDeadLetterAndReplay: with ErrorDeadLetter, an event whose handler always fails
// is moved to the dead letter queue after the retries and the partition goes on. The
// replay redelivers it to that group only: its handler gets it as stored (same
// partition, offset and id, Batch.Redelivered), another group of the stream sees
// nothing, and nothing is appended to the stream. A redelivery that fails again makes
// the same dead letter pending again, with its attempts added; replayed again and
// handled, it is marked redelivered.
func TestDeadLetterAndReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group, other := testdb.Name("g"), testdb.Name("other")
	pos := produce(t, pool, stream, 0, 10)
	poison := pos[4].Offset
	var healed, failAgain atomic.Bool
	var h, o handled
	var redelivered atomic.Int32
	var redeliveredEvent atomic.Pointer[streams.Event]
	cfg := testConfig(stream, group)
	cfg.OnHandlerError = ErrorDeadLetter
	cfg.MaxRetries = 2
	c, err := New(pool, cfg)
	require.NoError(t, err)
	runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		if b.Redelivered {
			if len(b.DeadLetterIDs) != len(b.Events) {
				return nil // not marked redelivered: the wait below fails
			}
			if failAgain.Load() {
				return errors.New("poison again")
			}
			redelivered.Add(1)
			redeliveredEvent.Store(&b.Events[0])
			return nil
		}
		for _, e := range b.Events {
			if e.Offset == poison && !healed.Load() {
				return errors.New("poison")
			}
		}
		for _, e := range b.Events {
			h.add(e.Partition, e.Offset)
		}
		return nil
	})
	oc, err := New(pool, testConfig(stream, other))
	require.NoError(t, err)
	runConsumer(t, oc, func(ctx context.Context, b *Batch) error {
		for _, e := range b.Events {
			o.add(e.Partition, e.Offset)
		}
		return nil
	})
	waitFor(t, 10*time.Second, "lag 0", func() bool {
		return groupLag(t, pool, stream, group) == 0 && groupLag(t, pool, stream, other) == 0
	})
	admin := NewAdmin(pool)
	dl, err := admin.DeadLetters(ctx, stream, group, "pending")
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.Equal(t, poison, dl[0].Offset)
	require.Equal(t, 3, dl[0].Attempts)
	require.Contains(t, dl[0].Error, "poison")
	require.Contains(t, dl[0].ErrorDetail, "*errors.errorString")
	for i, p := range pos {
		if i != 4 {
			require.NotZero(t, h.seen[[2]int64{0, p.Offset}], "event %d handled despite the poison one", p.Offset)
		}
	}

	// Replayed, failing again: pending again, the same record, attempts added.
	failAgain.Store(true)
	require.NoError(t, admin.ReplayDeadLetter(ctx, stream, dl[0].ID, "test"))
	waitFor(t, 10*time.Second, "pending again", func() bool {
		again, err := admin.DeadLetters(ctx, stream, group, "pending")
		require.NoError(t, err)
		return len(again) == 1 && again[0].Attempts > 3
	})
	again, err := admin.DeadLetters(ctx, stream, group, "")
	require.NoError(t, err)
	require.Len(t, again, 1, "one dead letter per (group, event)")
	require.Equal(t, dl[0].ID, again[0].ID)
	require.Contains(t, again[0].Error, "poison again")
	require.Empty(t, again[0].ResolvedBy)

	failAgain.Store(false)
	require.NoError(t, admin.ReplayDeadLetter(ctx, stream, dl[0].ID, "test"))
	waitFor(t, 10*time.Second, "redelivered", func() bool { return redelivered.Load() == 1 })
	e := redeliveredEvent.Load()
	require.Equal(t, poison, e.Offset)
	require.Equal(t, dl[0].EventID, e.EventID)
	require.Equal(t, int32(0), e.Partition)
	waitFor(t, 10*time.Second, "marked redelivered", func() bool {
		done, err := admin.DeadLetters(ctx, stream, group, "replayed")
		require.NoError(t, err)
		return len(done) == 1 && done[0].RedeliveredAt != nil
	})
	done, err := admin.DeadLetters(ctx, stream, group, "replayed")
	require.NoError(t, err)
	require.Equal(t, "test", done[0].ResolvedBy)

	_, err = NewAdmin(pool).DeadLetters(ctx, stream, group, "bogus")
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorIs(t, admin.ReplayDeadLetter(ctx, stream, dl[0].ID, "test"), ErrDeadLetterNotFound, "a dead letter is replayed once")
	require.ErrorIs(t, admin.DiscardDeadLetter(ctx, stream, dl[0].ID, "test"), ErrDeadLetterNotFound)
	require.ErrorIs(t, admin.ResolveDeadLetter(ctx, stream, dl[0].ID, "test"), ErrDeadLetterNotFound)

	// Nothing was appended, and the other group saw each event once.
	var next int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT next_offset FROM streamd.stream_partitions WHERE stream_name = $1", stream).Scan(&next))
	require.Equal(t, int64(10), next)
	o.mu.Lock()
	defer o.mu.Unlock()
	require.Len(t, o.seen, 10)
	for k, n := range o.seen {
		require.Equal(t, 1, n, "the other group handled %v once", k)
	}
	require.Equal(t, int32(1), redelivered.Load(), "redelivered once")
}

// TestResolveAndDiscardDeadLetters: seed 000's resolved (dealt with, no replay) and
// discarded, each recording who and when; a settled dead letter is not settled again.
func TestResolveAndDiscardDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	pos := produce(t, pool, stream, 0, 3)
	cfg := testConfig(stream, group)
	cfg.OnHandlerError = ErrorDeadLetter
	cfg.MaxRetries = NoRetries
	c, err := New(pool, cfg)
	require.NoError(t, err)
	runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		for _, e := range b.Events {
			if e.Offset != pos[0].Offset {
				return errors.New("poison")
			}
		}
		return nil
	})
	admin := NewAdmin(pool)
	var dl []DeadLetter
	waitFor(t, 10*time.Second, "two dead letters", func() bool {
		dl, err = admin.DeadLetters(ctx, stream, group, "pending")
		require.NoError(t, err)
		return len(dl) == 2
	})
	require.NoError(t, admin.ResolveDeadLetter(ctx, stream, dl[0].ID, "alice"))
	require.NoError(t, admin.DiscardDeadLetter(ctx, stream, dl[1].ID, "bob"))
	resolved, err := admin.DeadLetters(ctx, stream, group, "resolved")
	require.NoError(t, err)
	require.Len(t, resolved, 1)
	require.Equal(t, "alice", resolved[0].ResolvedBy)
	require.NotNil(t, resolved[0].ResolvedAt)
	discarded, err := admin.DeadLetters(ctx, stream, group, "discarded")
	require.NoError(t, err)
	require.Len(t, discarded, 1)
	require.Equal(t, "bob", discarded[0].ResolvedBy)
	require.ErrorIs(t, admin.ReplayDeadLetter(ctx, stream, dl[0].ID, "x"), ErrDeadLetterNotFound)
}

// TestNoRetries: MaxRetries NoRetries hands a failing batch to OnHandlerError at its
// first failure (MaxRetries 0 means the default, 5): the poison event's batch is tried
// once, then the event alone once, and it is dead-lettered after that one attempt.
func TestNoRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	pos := produce(t, pool, stream, 0, 3)
	poison := pos[1].Offset
	var tries atomic.Int32
	cfg := testConfig(stream, group)
	cfg.OnHandlerError = ErrorDeadLetter
	cfg.MaxRetries = NoRetries
	cfg.RetryBackoff, cfg.RetryBackoffMax = time.Second, time.Second // a retry would show as a try
	c, err := New(pool, cfg)
	require.NoError(t, err)
	runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		for _, e := range b.Events {
			if e.Offset == poison {
				tries.Add(1)
				return errors.New("poison")
			}
		}
		return nil
	})
	waitFor(t, 10*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })
	dl, err := NewAdmin(pool).DeadLetters(ctx, stream, group, "pending")
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.Equal(t, poison, dl[0].Offset)
	require.Equal(t, 1, dl[0].Attempts)
	require.Equal(t, int32(2), tries.Load(), "the batch once, then the event alone once")
}

// TestPauseResume: a paused partition is not processed (by whoever owns it) until
// resumed; the others go on.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 2)
	group := testdb.Name("g")
	var h handled
	c, err := New(pool, testConfig(stream, group))
	require.NoError(t, err)
	runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		for _, e := range b.Events {
			h.add(e.Partition, e.Offset)
		}
		return nil
	})
	waitFor(t, 5*time.Second, "assigned", func() bool { return len(c.Assignment()) == 2 })
	require.NoError(t, c.Pause(ctx, 0))
	require.ErrorIs(t, c.Pause(ctx, 7), ErrInvalidArgument)
	waitFor(t, 5*time.Second, "worker paused", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		w := c.owned[0]
		return w != nil && w.isPaused()
	})
	client := streams.NewClient(pool, nil)
	_, err = client.Produce(ctx, streams.Record{Stream: stream, Partition: streams.PartitionOf(0), Data: []byte(`0`)},
		streams.Record{Stream: stream, Partition: streams.PartitionOf(1), Data: []byte(`1`)})
	require.NoError(t, err)
	waitFor(t, 5*time.Second, "partition 1 handled", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.seen[[2]int64{1, 0}] > 0
	})
	h.mu.Lock()
	require.Zero(t, h.seen[[2]int64{0, 0}], "paused partition not processed")
	h.mu.Unlock()
	require.NoError(t, c.Resume(ctx, 0))
	waitFor(t, 5*time.Second, "partition 0 handled after resume", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.seen[[2]int64{0, 0}] > 0
	})

	// The admin pauses only groups that exist: a mistyped group is not made.
	admin := NewAdmin(pool)
	require.ErrorIs(t, admin.Pause(ctx, stream, group+"-typo", 0), ErrGroupNotFound)
	require.ErrorIs(t, admin.Resume(ctx, stream, group+"-typo", 0), ErrGroupNotFound)
	groups, err := admin.ListGroups(ctx, stream)
	require.NoError(t, err)
	for _, g := range groups {
		require.NotEqual(t, group+"-typo", g.Group)
	}
	require.NoError(t, admin.Pause(ctx, stream, group, 1))
}

// TestOpenCommitTxDoesNotBlockTheGroup: a transaction that wrote a partition's first
// offset (its foreign key check holds FOR KEY SHARE on the group's row) and stays open,
// as a handler's transaction after CommitTx, does not block the group's operations: a
// resume and a join go through. They locked the group row FOR UPDATE, waited for the
// transaction's end, and could deadlock with it.
func TestOpenCommitTxDoesNotBlockTheGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 2)
	group := testdb.Name("g")
	c, err := New(pool, testConfig(stream, group))
	require.NoError(t, err)
	require.NoError(t, c.Pause(ctx, 1)) // makes the group

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// What the foreign key check of a first offset row takes.
	_, err = tx.Exec(ctx, `SELECT 1 FROM streamd.consumer_groups WHERE stream_name = $1 AND group_id = $2 FOR KEY SHARE`, stream, group)
	require.NoError(t, err)

	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, NewAdmin(pool).Resume(octx, stream, group, 1), "resume while the transaction is open")
	stop := runConsumer(t, c, func(context.Context, *Batch) error { return nil })
	waitFor(t, 5*time.Second, "joined and assigned while the transaction is open", func() bool { return len(c.Assignment()) == 2 })
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, stop())
}
