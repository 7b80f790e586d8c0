package wakeup

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHubCoalescesAndSeparatesKinds: many notifications before a read are one
// pending wake-up; a stream and a queue of the same name are different
// subscriptions; a closed subscription is no longer woken; NotifyAll wakes all.
func TestHubCoalescesAndSeparatesKinds(t *testing.T) {
	t.Parallel()
	h := NewHub()
	s := h.Subscribe(KindStream, "x")
	q := h.Subscribe(KindQueue, "x")
	for i := 0; i < 100; i++ {
		h.Notify(KindStream, "x") // never blocks
	}
	require.Len(t, s.C, 1, "coalesced into one pending wake-up")
	require.Len(t, q.C, 0, "the queue x is not the stream x")
	require.True(t, s.Wait(context.Background(), time.Millisecond))
	require.False(t, s.Wait(context.Background(), time.Millisecond), "nothing pending")

	h.NotifyAll()
	require.Len(t, s.C, 1)
	require.Len(t, q.C, 1)
	<-s.C
	<-q.C
	s.Close()
	s.Close() // idempotent
	h.Notify(KindStream, "x")
	require.Len(t, s.C, 0, "closed")
	require.Empty(t, h.subs[key{KindStream, "x"}])
}

// TestSubscribeStreams: one subscription over several streams is woken by a commit
// to any partition of any of them, not by other streams or by a queue of the same
// name, and Close removes it from every stream.
func TestSubscribeStreams(t *testing.T) {
	t.Parallel()
	h := NewHub()
	s := h.SubscribeStreams("a", "b", "a")
	h.Notify(KindQueue, "a")
	h.NotifyPartitions("c", 0)
	require.Len(t, s.C, 0, "a queue a and a stream c are not watched")
	h.NotifyPartitions("b", 3)
	require.True(t, s.Wait(context.Background(), time.Millisecond), "b's partition 3")
	h.Notify(KindStream, "a")
	require.True(t, s.Wait(context.Background(), time.Millisecond), "a")
	s.Close()
	require.Empty(t, h.subs, "closed under every stream")
}

// TestPayloadRoundTrip: what the broadcaster encodes, the listener decodes to the
// same streams, partitions and queues; a stream with more partitions than fit in one
// line is split; "*" means everyone; junk lines are ignored.
func TestPayloadRoundTrip(t *testing.T) {
	t.Parallel()
	lines := encodeStream("orders.v1", []int32{0, 5, 7})
	require.Equal(t, []string{"s 0,5,7 orders.v1"}, lines)
	payload := lines[0] + "\n" + encodeQueue("orders.v1") + "\nbogus\ns x\ns 1,y orders.v2"
	type got struct {
		kind  Kind
		name  string
		parts []int32
	}
	var gots []got
	all := decodePayload(payload,
		func(s string, ps ...int32) { gots = append(gots, got{KindStream, s, append([]int32(nil), ps...)}) },
		func(q string) { gots = append(gots, got{KindQueue, q, nil}) })
	require.False(t, all)
	require.Equal(t, []got{
		{KindStream, "orders.v1", []int32{0, 5, 7}},
		{KindQueue, "orders.v1", nil},
		{KindStream, "orders.v2", []int32{1}},
	}, gots)
	require.True(t, decodePayload(payloadAll, func(string, ...int32) { t.Fatal("no names for *") }, func(string) { t.Fatal("no names for *") }))

	many := make([]int32, 10000)
	for i := range many {
		many[i] = int32(i)
	}
	lines = encodeStream("big", many)
	require.Greater(t, len(lines), 1, "split")
	var back []int32
	for _, l := range lines {
		require.LessOrEqual(t, len(l), maxPayload)
		decodePayload(l, func(_ string, ps ...int32) { back = append(back, ps...) }, nil)
	}
	require.Equal(t, many, back)
}

// TestHubPartitions: a partition subscriber is woken by its partition and by
// whole-stream notifications, not by other partitions; a whole-stream subscriber is
// woken by any partition.
func TestHubPartitions(t *testing.T) {
	t.Parallel()
	h := NewHub()
	p1 := h.SubscribePartition("s", 1)
	p2 := h.SubscribePartition("s", 2)
	any := h.Subscribe(KindStream, "s")
	defer p1.Close()
	defer p2.Close()
	defer any.Close()
	h.NotifyPartitions("s", 2, 3)
	require.Len(t, p1.C, 0, "partition 1 not woken by 2 and 3")
	require.Len(t, p2.C, 1)
	require.Len(t, any.C, 1)
	<-p2.C
	<-any.C
	h.Notify(KindStream, "s")
	require.Len(t, p1.C, 1, "a whole-stream notification wakes every partition")
	require.Len(t, p2.C, 1)
	require.Len(t, any.C, 1)
	h.NotifyPartitions("other", 1)
	<-p1.C
	h.NotifyPartitions("s")
	require.Len(t, p1.C, 0)
}

// TestWaiterBacksOffAndResets: without wake-ups the waits double up to the maximum;
// a wake-up ends a wait at once and starts the intervals over, as Reset does.
func TestWaiterBacksOffAndResets(t *testing.T) {
	t.Parallel()
	h := NewHub()
	s := h.Subscribe(KindQueue, "q")
	defer s.Close()
	w, err := NewWaiter(s, &PollOpts{MinInterval: 10 * time.Millisecond, MaxInterval: 40 * time.Millisecond})
	require.NoError(t, err)
	ctx := context.Background()
	for _, want := range []time.Duration{10, 20, 40, 40} {
		require.Equal(t, want*time.Millisecond, w.bo.Peek())
		require.False(t, w.Wait(ctx))
	}
	h.Notify(KindQueue, "q")
	require.True(t, w.Wait(ctx), "a pending wake-up ends the wait (true), not the interval (false)")
	require.Equal(t, 10*time.Millisecond, w.bo.Peek(), "a wake-up starts the intervals over")
	require.False(t, w.Wait(ctx))
	w.Reset()
	require.Equal(t, 10*time.Millisecond, w.bo.Peek())
	_, err = NewWaiter(s, &PollOpts{MinInterval: time.Second, MaxInterval: time.Millisecond})
	require.ErrorContains(t, err, "MaxInterval")
}

// TestWaiterWaitOrEndsWhenAsked: WaitOr ends (false) when its channel delivers, long
// before the interval, and leaves the interval as it was (a read asked for is not a
// poll that found nothing); a wake-up still ends it (true) and starts the intervals
// over; without a subscription it is asked or polls.
func TestWaiterWaitOrEndsWhenAsked(t *testing.T) {
	t.Parallel()
	h := NewHub()
	s := h.Subscribe(KindQueue, "q")
	defer s.Close()
	ctx := context.Background()
	for _, sub := range []*Subscription{s, nil} {
		w, err := NewWaiter(sub, &PollOpts{MinInterval: time.Hour, MaxInterval: 4 * time.Hour})
		require.NoError(t, err)
		ask := make(chan struct{}, 1)
		ask <- struct{}{}
		require.False(t, w.WaitOr(ctx, ask), "asked, not woken")
		require.Equal(t, time.Hour, w.bo.Peek(), "an asked read leaves the interval")
	}
	w, err := NewWaiter(s, &PollOpts{MinInterval: 10 * time.Millisecond, MaxInterval: time.Hour})
	require.NoError(t, err)
	require.False(t, w.WaitOr(ctx, nil), "the interval passed")
	require.Equal(t, 20*time.Millisecond, w.bo.Peek(), "a poll that passed doubles the interval")
	h.Notify(KindQueue, "q")
	require.True(t, w.WaitOr(ctx, make(chan struct{})))
	require.Equal(t, 10*time.Millisecond, w.bo.Peek())
}

// TestPoll: Poll tries at once, again at each wake-up, and returns try's error, nil
// at the deadline, or ctx's error when ctx ends first; a nil subscription polls.
func TestPoll(t *testing.T) {
	t.Parallel()
	h := NewHub()
	s := h.Subscribe(KindQueue, "q")
	defer s.Close()
	ctx := context.Background()
	hour := &PollOpts{MinInterval: time.Hour, MaxInterval: time.Hour}

	tries := 0
	err := Poll(ctx, s, time.Now().Add(time.Minute), hour, func() (bool, error) {
		tries++
		if tries < 3 {
			h.Notify(KindQueue, "q") // ends the hour-long wait at once
			return false, nil
		}
		return true, nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, tries)

	boom := errors.New("boom")
	require.ErrorIs(t, Poll(ctx, s, time.Now().Add(time.Minute), hour, func() (bool, error) { return false, boom }), boom)

	// A nil subscription polls: try runs again, with nothing to wake it, until it
	// holds (counted, not timed: a loaded machine made a 50 ms window hold only two
	// tries).
	fast := &PollOpts{MinInterval: 5 * time.Millisecond, MaxInterval: 5 * time.Millisecond}
	tries = 0
	require.NoError(t, Poll(ctx, nil, time.Now().Add(time.Minute), fast, func() (bool, error) { tries++; return tries == 3, nil }))
	require.Equal(t, 3, tries, "a nil subscription polls")
	// At the deadline: nil, and not before it.
	start := time.Now()
	require.NoError(t, Poll(ctx, nil, start.Add(50*time.Millisecond), fast, func() (bool, error) { return false, nil }))
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "returned before the deadline")

	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(20*time.Millisecond, cancel)
	require.ErrorIs(t, Poll(cctx, s, time.Now().Add(time.Minute), hour, func() (bool, error) { return false, nil }), context.Canceled)

	require.ErrorContains(t, Poll(ctx, s, time.Now(), &PollOpts{MinInterval: -1}, nil), "MinInterval")
}

// TestSubscriptionWokenNamesThePartitions: a stream-wide subscription collects the
// partitions its wake-ups named, by stream, until Woken takes them with the pending
// wake-up; a wake-up that names no partition (Notify, NotifyAll) says "read
// everything".
func TestSubscriptionWokenNamesThePartitions(t *testing.T) {
	t.Parallel()
	h := NewHub()
	s := h.SubscribeStreams("a", "b")
	defer s.Close()
	w, all := s.Woken()
	require.Empty(t, w)
	require.False(t, all)

	h.NotifyPartitions("a", 2)
	h.NotifyPartitions("a", 0, 2)
	h.NotifyPartitions("b", 5)
	h.NotifyPartitions("c", 1) // not subscribed
	require.Len(t, s.C, 1)
	w, all = s.Woken()
	require.Len(t, s.C, 0, "Woken takes the pending wake-up it answers for")
	require.False(t, all)
	for _, ps := range w {
		slices.Sort(ps)
	}
	require.Equal(t, map[string][]int32{"a": {0, 2}, "b": {5}}, w)
	w, all = s.Woken()
	require.Empty(t, w, "taken")
	require.False(t, all)

	h.NotifyPartitions("a", 1)
	h.Notify(KindStream, "b")
	w, all = s.Woken()
	require.True(t, all, "a wake-up without partitions")
	require.Equal(t, map[string][]int32{"a": {1}}, w)
	_, all = s.Woken()
	require.False(t, all, "taken")

	h.NotifyAll()
	_, all = s.Woken()
	require.True(t, all)
	h.NotifyPartitions("a", AnyPartition)
	_, all = s.Woken()
	require.True(t, all, "AnyPartition names no partition")
}
