// Package wakeup tells readers of streams and queues that something may have been
// committed for them, so they fetch at once instead of at their next poll.
//
// Wake-ups are hints, never data: readers always read through SQL by offset range
// (streams) or visibility (queues), so ordering and delivery never depend on them,
// and every reader keeps polling with backoff as the safety net (Waiter does both).
//
// The parts:
//   - Hub: the in-process fan-out. Subscribe(kind, name) returns a Subscription whose
//     channel holds at most one pending wake-up (coalescing); notifying never blocks.
//   - Listener: a Hub fed by one shared LISTEN connection per process, on channel
//     streamd_wakeup. Run owns the connection and reconnects with backoff.
//   - Broadcaster: what streamd runs. It tails the WAL (logical replication, see
//     internal/tailer) and re-sends the committed transactions' stream and queue names
//     with pg_notify from its own short transactions, coalesced (one notification in
//     flight; what arrives meanwhile goes out together, one line per name), so
//     producers never pay NOTIFY's global commit lock. It can also feed a Hub directly
//     (BroadcasterConfig.Hub, NoNotify), which is how a worker runs a tailer
//     in-process.
//   - Poll and Waiter: a reader's long poll (the one loop of the log's Fetch, the
//     queue's Receive and the consumer groups), waiting between reads for a wake-up
//     or its poll interval (backing off), so delivery goes on by polling when
//     wake-ups stop.
//
// A *Hub is the one way to give wake-ups to a reader: streams.FetchOpts.Wakeups,
// messages.ClientConfig.Wakeups and consumergroup.Config.Wakeups all take one (a
// Listener's Hub, or one an in-process Broadcaster feeds).
//
// Goroutines: Listener.Run and Broadcaster.Run block in the caller's goroutine;
// Broadcaster.Run starts the tailer's goroutine and waits for it before returning.
// Hub, Subscription and Source start none.
package wakeup

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/streamd/streamd/internal/tailer"
)

// Channel is the LISTEN/NOTIFY channel the Broadcaster notifies and Listeners listen on.
const Channel = "streamd_wakeup"

// Kind says whether a name is a stream of the log or a queue (they are separate
// namespaces). It is the tailer's Kind: one type from the WAL to the readers.
type Kind = tailer.Kind

const (
	// KindStream is a stream of the persistent log (streamd.events).
	KindStream = tailer.KindStream
	// KindQueue is a queue (streamd.queue_messages).
	KindQueue = tailer.KindQueue
)

type key struct {
	kind Kind
	name string
}

// AnyPartition subscribes to every partition of a stream (and is the only
// "partition" of a queue).
const AnyPartition int32 = -1

// Hub fans wake-ups out to subscribers in the process. The zero value is not usable;
// call NewHub. All methods are safe for concurrent use.
type Hub struct {
	mu   sync.Mutex
	subs map[key]map[int32]map[*Subscription]struct{} // by name, then partition
}

// NewHub returns an empty Hub.
func NewHub() *Hub { return &Hub{subs: map[key]map[int32]map[*Subscription]struct{}{}} }

// Subscription receives the wake-ups of one stream (or one of its partitions) or
// queue. C holds at most one pending wake-up: several notifications before the
// reader looks coalesce into one.
type Subscription struct {
	// C receives a value when something may have been committed for the name.
	C         <-chan struct{}
	c         chan struct{}
	hub       *Hub
	keys      []key
	partition int32
	once      sync.Once
	// woken and wokenAll (guarded by hub.mu) are what the wake-ups since the last
	// Woken named: by stream, the partitions; or a wake-up that named none.
	woken    map[string]map[int32]struct{}
	wokenAll bool
}

// Subscribe starts receiving wake-ups for (kind, name), any partition. Subscribe
// before the read that may find nothing, so a commit between that read and the wait
// still wakes the wait. Close the subscription when done.
func (h *Hub) Subscribe(kind Kind, name string) *Subscription {
	return h.subscribe([]key{{kind, name}}, AnyPartition)
}

// SubscribeStreams starts receiving wake-ups for any partition of any of streams,
// on one subscription (a Kafka fetch that reads several topics waits on one channel).
func (h *Hub) SubscribeStreams(streams ...string) *Subscription {
	keys := make([]key, len(streams))
	for i, s := range streams {
		keys[i] = key{KindStream, s}
	}
	return h.subscribe(keys, AnyPartition)
}

// SubscribePartition starts receiving wake-ups for one partition of a stream only,
// so that a consumer that owns a few partitions is not woken by the others.
func (h *Hub) SubscribePartition(stream string, partition int32) *Subscription {
	return h.subscribe([]key{{KindStream, stream}}, partition)
}

func (h *Hub) subscribe(keys []key, partition int32) *Subscription {
	c := make(chan struct{}, 1)
	s := &Subscription{C: c, c: c, hub: h, keys: keys, partition: partition}
	h.mu.Lock()
	for _, k := range keys {
		byPart := h.subs[k]
		if byPart == nil {
			byPart = map[int32]map[*Subscription]struct{}{}
			h.subs[k] = byPart
		}
		set := byPart[partition]
		if set == nil {
			set = map[*Subscription]struct{}{}
			byPart[partition] = set
		}
		set[s] = struct{}{}
	}
	h.mu.Unlock()
	return s
}

// Close ends the subscription. It is idempotent.
func (s *Subscription) Close() {
	s.once.Do(func() {
		h := s.hub
		h.mu.Lock()
		for _, k := range s.keys {
			if byPart := h.subs[k]; byPart != nil {
				delete(byPart[s.partition], s)
				if len(byPart[s.partition]) == 0 {
					delete(byPart, s.partition)
				}
				if len(byPart) == 0 {
					delete(h.subs, k)
				}
			}
		}
		h.mu.Unlock()
	})
}

// Wait blocks until a wake-up arrives (true), or timeout passes or ctx ends (false).
// A wake-up that arrived since the last Wait returns at once.
func (s *Subscription) Wait(ctx context.Context, timeout time.Duration) bool {
	return waitEnd(ctx, s, timeout, nil) == woken
}

// How a wait ended (waitEnd).
type ending int

const (
	woken    ending = iota // a wake-up of the subscription
	asked                  // the also channel delivered
	timedOut               // the timeout passed
	canceled               // ctx ended
)

// waitEnd waits for a wake-up of s (a nil s has none), a value from also (a nil also
// never delivers), timeout or the end of ctx, and says which came. A wake-up that
// arrived since the last wait ends it at once.
func waitEnd(ctx context.Context, s *Subscription, timeout time.Duration, also <-chan struct{}) ending {
	var c <-chan struct{}
	if s != nil {
		c = s.c
		select {
		case <-c:
			return woken
		default:
		}
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-c:
		return woken
	case <-also:
		return asked
	case <-t.C:
		return timedOut
	case <-ctx.Done():
		return canceled
	}
}

// Woken returns, and forgets, the partitions that the wake-ups since the last call
// (or since the subscription began) named, by stream, so that a reader woken for a
// few partitions of a stream-wide subscription can read only those. all is true when
// one of them named no partition (Notify, NotifyAll: a reconnect may have missed
// some): read everything then. It also takes the pending wake-up from C, since it
// returns what that wake-up was for: so a wait that ends at a wake-up after Woken
// finds its partitions in the next Woken, and an empty answer with all false means
// that no wake-up came since the last call (the wait ended by its timeout): a reader
// that must not miss a commit reads everything then, as the safety net. Wake-ups
// stay hints: the partitions say where to look, never that the others are unchanged
// beyond what the reader's own reads show. Safe for concurrent use.
func (s *Subscription) Woken() (byStream map[string][]int32, all bool) {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	select {
	case <-s.c:
	default:
	}
	all, s.wokenAll = s.wokenAll, false
	if len(s.woken) == 0 {
		return nil, all
	}
	byStream = make(map[string][]int32, len(s.woken))
	for name, parts := range s.woken {
		for p := range parts {
			byStream[name] = append(byStream[name], p)
		}
	}
	clear(s.woken)
	return byStream, all
}

// note records what woke s (the hub's mu held): partitions of stream, or none
// known (stream "" or no partitions).
func (s *Subscription) note(stream string, partitions []int32) {
	if stream == "" || !slices.ContainsFunc(partitions, func(p int32) bool { return p != AnyPartition }) {
		s.wokenAll = true
		return
	}
	if s.woken == nil {
		s.woken = map[string]map[int32]struct{}{}
	}
	set := s.woken[stream]
	if set == nil {
		set = map[int32]struct{}{}
		s.woken[stream] = set
	}
	for _, p := range partitions {
		if p != AnyPartition {
			set[p] = struct{}{}
		}
	}
}

func (s *Subscription) wake() {
	select {
	case s.c <- struct{}{}:
	default: // one pending wake-up is enough
	}
}

// Notify wakes every subscriber of (kind, name), whatever partition they watch. It
// never blocks.
func (h *Hub) Notify(kind Kind, name string) {
	h.mu.Lock()
	for _, set := range h.subs[key{kind, name}] {
		for s := range set {
			s.note("", nil)
			s.wake()
		}
	}
	h.mu.Unlock()
}

// NotifyPartitions wakes the subscribers of the given partitions of stream and those
// of the whole stream. It never blocks.
func (h *Hub) NotifyPartitions(stream string, partitions ...int32) {
	h.mu.Lock()
	if byPart := h.subs[key{KindStream, stream}]; byPart != nil {
		for s := range byPart[AnyPartition] {
			s.note(stream, partitions)
			s.wake()
		}
		for _, p := range partitions {
			if p == AnyPartition {
				continue
			}
			for s := range byPart[p] {
				s.wake()
			}
		}
	}
	h.mu.Unlock()
}

// NotifyAll wakes every subscriber: wake-ups may have been missed (a reconnect).
func (h *Hub) NotifyAll() {
	h.mu.Lock()
	for _, byPart := range h.subs {
		for _, set := range byPart {
			for s := range set {
				s.note("", nil)
				s.wake()
			}
		}
	}
	h.mu.Unlock()
}
