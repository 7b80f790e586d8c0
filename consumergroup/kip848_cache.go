package consumergroup

import (
	"container/list"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// The KIP-848 subscription caches of a Classic: compiled regexes, and subscriptions
// resolved to stream names, each valid for one version of the stream set
// (streamd.stream_set_version, migration 0135), which every heartbeat reads in its
// first statement. A heartbeat resolves its subscription again only when the
// subscription or the stream set changed since this process last resolved it, as
// Kafka resolves regexes again on a metadata change. Both are bounded LRUs, shared by
// every member served by the Classic (the members of a group usually share one
// subscription).

const (
	// regexCacheSize bounds the compiled regexes kept.
	regexCacheSize = 1024
	// resolvedCacheSize bounds the resolved subscriptions kept (each holds the names it
	// resolved to).
	resolvedCacheSize = 1024
)

// lru is a bounded map that forgets its least recently used entry; safe for
// concurrent use.
type lru[K comparable, V any] struct {
	mu   sync.Mutex
	max  int
	ll   *list.List // of *lruEntry, most recent first
	byID map[K]*list.Element
}

type lruEntry[K comparable, V any] struct {
	key K
	val V
}

func newLRU[K comparable, V any](max int) *lru[K, V] {
	return &lru[K, V]{max: max, ll: list.New(), byID: map[K]*list.Element{}}
}

func (l *lru[K, V]) get(k K) (V, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.byID[k]
	if !ok {
		var zero V
		return zero, false
	}
	l.ll.MoveToFront(e)
	return e.Value.(*lruEntry[K, V]).val, true
}

func (l *lru[K, V]) put(k K, v V) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.byID[k]; ok {
		e.Value.(*lruEntry[K, V]).val = v
		l.ll.MoveToFront(e)
		return
	}
	l.byID[k] = l.ll.PushFront(&lruEntry[K, V]{key: k, val: v})
	for l.ll.Len() > l.max {
		last := l.ll.Back()
		l.ll.Remove(last)
		delete(l.byID, last.Value.(*lruEntry[K, V]).key)
	}
}

func (l *lru[K, V]) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ll.Len()
}

// compiledRegex is a subscription regex compiled, or why it does not compile.
type compiledRegex struct {
	rx  *regexp.Regexp
	err error
}

// resolvedSubscription is a subscription's streams at a version of the stream set.
type resolvedSubscription struct {
	version int64
	streams []string
}

// subscriptionCache holds a Classic's compiled regexes and resolved subscriptions,
// with counters the tests read.
type subscriptionCache struct {
	regexes  *lru[string, compiledRegex]
	resolved *lru[string, resolvedSubscription]
	compiles atomic.Int64 // regexes compiled
	resolves atomic.Int64 // subscriptions resolved against streamd.streams
}

func newSubscriptionCache() *subscriptionCache {
	return &subscriptionCache{
		regexes:  newLRU[string, compiledRegex](regexCacheSize),
		resolved: newLRU[string, resolvedSubscription](resolvedCacheSize),
	}
}

// compile returns a subscription regex compiled as Kafka applies it (to whole names),
// from the cache when it was compiled before.
func (s *subscriptionCache) compile(re string) (*regexp.Regexp, error) {
	if c, ok := s.regexes.get(re); ok {
		return c.rx, c.err
	}
	s.compiles.Add(1)
	rx, err := compileSubscription(re)
	s.regexes.put(re, compiledRegex{rx: rx, err: err})
	return rx, err
}

// subscriptionKey identifies a subscription: its regex and its names (in any order).
func subscriptionKey(topics []string, regex *string) string {
	names := slices.Clone(topics)
	slices.Sort(names)
	names = slices.Compact(names)
	var b strings.Builder
	if regex != nil {
		b.WriteString(strconv.Itoa(len(*regex)))
		b.WriteByte(':')
		b.WriteString(*regex)
	}
	for _, n := range names {
		b.WriteByte(0)
		b.WriteString(n)
	}
	return b.String()
}
