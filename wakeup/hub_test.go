package wakeup

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/messages"
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

// TestPayloadRoundTrip: what the broadcaster encodes, the listener decodes to the
// same kinds and names; "*" means everyone; junk lines are ignored.
func TestPayloadRoundTrip(t *testing.T) {
	t.Parallel()
	payload := encodeLine(KindStream, "orders.v1") + "\n" + encodeLine(KindQueue, "orders.v1") + "\nbogus\n" + encodeLine(KindStream, "a b")
	var got []key
	all := decodePayload(payload, func(k Kind, n string) { got = append(got, key{k, n}) })
	require.False(t, all)
	require.Equal(t, []key{{KindStream, "orders.v1"}, {KindQueue, "orders.v1"}, {KindStream, "a b"}}, got)
	require.True(t, decodePayload(payloadAll, func(Kind, string) { t.Fatal("no names for *") }))
}

// TestWaiterBacksOffAndResets: without wake-ups the waits double up to the maximum;
// a wake-up ends a wait at once; Reset starts over.
func TestWaiterBacksOffAndResets(t *testing.T) {
	t.Parallel()
	h := NewHub()
	s := h.Subscribe(KindQueue, "q")
	defer s.Close()
	w, err := NewWaiter(s, &WaiterOpts{MinInterval: 10 * time.Millisecond, MaxInterval: 40 * time.Millisecond})
	require.NoError(t, err)
	ctx := context.Background()
	for _, want := range []time.Duration{10, 20, 40, 40} {
		require.Equal(t, want*time.Millisecond, w.cur)
		require.False(t, w.Wait(ctx))
	}
	h.Notify(KindQueue, "q")
	start := time.Now()
	require.True(t, w.Wait(ctx))
	require.Less(t, time.Since(start), 40*time.Millisecond)
	w.Reset()
	require.Equal(t, 10*time.Millisecond, w.cur)
	_, err = NewWaiter(s, &WaiterOpts{MinInterval: time.Second, MaxInterval: time.Millisecond})
	require.ErrorContains(t, err, "MaxInterval")
}

// The hub's queue view is what messages.Client takes as its WakeupSource.
var _ messages.WakeupSource = NewHub().Queues()
