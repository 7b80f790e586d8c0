package kafka

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamd/streamd/streams"
)

// headCacheMaxAge bounds how long a partition's cached head (headCache) is trusted
// without a read: the wait for a commit whose wake-up was lost, and for a log start
// moved or a stream deleted by another instance or another door, which send none.
const headCacheMaxAge = 250 * time.Millisecond

// headCacheMaxEntries bounds the cache: past it, it starts again empty.
const headCacheMaxEntries = 100_000

// headCache keeps, by partition, the head (log start, log end) that the Server's
// last read of it saw, with the wake-up hub's Generation of the partition taken
// before that read. While the Generation is unchanged (no commit to the partition
// announced since) and the entry is younger than headCacheMaxAge, a fetch's first
// pass takes a partition at its log end from here instead of reading the topic's
// head rows: a Kafka consumer keeps one fetch in flight and sends the next as soon
// as it has the answer, so that read was on the path of nearly every record (bench/
// RESULTS.md, session 11). Without a wake-up hub it is not used.
type headCache struct {
	mu     sync.Mutex
	m      map[partKey]headEntry
	maxAge time.Duration // 0: headCacheMaxAge
	// reads counts the head-row reads of fetches' first passes (readHeads; tests).
	reads atomic.Int64
}

type headEntry struct {
	head streams.PartitionInfo
	gen  uint64
	at   time.Time
}

// generation returns the hub's Generation of the partition, and false without a hub.
func (s *Server) generation(topic string, partition int32) (uint64, bool) {
	if s.cfg.Wakeups == nil {
		return 0, false
	}
	return s.cfg.Wakeups.Generation(topic, partition), true
}

// put records a head read that started at at, when the partition's Generation was
// gen. An entry read later (or at the same Generation, further on) is kept.
func (c *headCache) put(k partKey, head streams.PartitionInfo, gen uint64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= headCacheMaxEntries {
		c.m = map[partKey]headEntry{}
	}
	if old, ok := c.m[k]; ok && (old.gen > gen || old.gen == gen && old.head.NextOffset > head.NextOffset) {
		return
	}
	c.m[k] = headEntry{head: head, gen: gen, at: at}
}

// get returns the partition's head if no wake-up for it came since it was read (gen
// is the Generation now) and it is younger than headCacheMaxAge (or c.maxAge, when
// set: tests).
func (c *headCache) get(k partKey, gen uint64, now time.Time) (streams.PartitionInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	maxAge := headCacheMaxAge
	if c.maxAge > 0 {
		maxAge = c.maxAge
	}
	e, ok := c.m[k]
	if !ok || e.gen != gen || now.Sub(e.at) >= maxAge {
		return streams.PartitionInfo{}, false
	}
	return e.head, true
}

// forget drops a topic's entries: this instance deleted its records or the topic.
func (c *headCache) forget(topic string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.m {
		if k.topic == topic {
			delete(c.m, k)
		}
	}
}
