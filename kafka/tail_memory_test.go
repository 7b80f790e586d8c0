package kafka

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestTailReaderMemoryIsWhatItCounts: a reader that follows a partition a record at a
// time (a read per wake-up, as at the tail) holds no more heap than the bytes its
// bounds count (heldSize), give or take its fixed costs: not the buffer each read
// decoded its records into (streams' fetch decoder: at least 64 KiB per read), nor
// records' Events uncounted. Not parallel: it measures the heap.
func TestTailReaderMemoryIsWhatItCounts(t *testing.T) {
	sn := newTailScene(t, "tailmemory")
	ts, hub, ctx, topic, sc := sn.ts, sn.hub, sn.ctx, sn.topic, sn.sc
	sn.startReader(t, newClient(t, []string{ts.addr}))

	const n = 300 // 16-byte records, one read each
	for i := range n {
		_, err := sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: fmt.Appendf(nil, "record-%09d", i)}}, nil)
		require.NoError(t, err)
		hub.NotifyPartitions(topic, 0)
		require.Eventually(t, func() bool { return tailHolds(ts, topic, 0, int64(i+1)) }, 10*time.Second, 100*time.Microsecond)
	}
	r := ts.srv.tails.get(partKey{topic, 0})
	require.NotNil(t, r)
	r.mu.Lock()
	held, counted := r.held.len(), r.bytes
	r.mu.Unlock()
	require.Equal(t, n, held)
	var withReader, without runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&withReader)
	ts.srv.tails.drop(topic)
	runtime.GC()
	runtime.ReadMemStats(&without)
	retained := int64(withReader.HeapAlloc) - int64(without.HeapAlloc)
	t.Logf("the reader counted %d bytes for %d records and held %d", counted, held, retained)
	// A 64 KiB buffer per read would be about 19 MiB; the payloads alone, 4,800 bytes.
	require.LessOrEqual(t, retained, int64(counted)+256<<10, "heap a reader held for %d records it counted as %d bytes", held, counted)
}

// TestTailReaderAtItsBoundAllocatesLittlePerRead: a reader at its bound (a partition
// followed a record at a time, as at the tail, past the ~1,000 small records
// tailMaxBytes holds) allocates per read about what the read decoded, not a copy of
// every record it keeps (248 bytes an Event, about 250 KB a read: 1.6 GB in a 15 s
// run of the end-to-end bench, a GC every 25 ms). Not parallel: it measures the heap.
func TestTailReaderAtItsBoundAllocatesLittlePerRead(t *testing.T) {
	sn := newTailScene(t, "tailboundalloc")
	ts, hub, ctx, topic, sc := sn.ts, sn.hub, sn.ctx, sn.topic, sn.sc
	sn.startReader(t, newClient(t, []string{ts.addr}))

	// Past the bound at once: 2,000 records of 16 bytes (heldSize 1,040 each).
	recs := make([]streams.Record, 2000)
	for i := range recs {
		recs[i] = streams.Record{Bytes: fmt.Appendf(nil, "record-%09d", i)}
	}
	_, err := sc.AppendPartition(ctx, topic, 0, recs, nil)
	require.NoError(t, err)
	hub.NotifyPartitions(topic, 0)
	testdb.WaitFor(t, 10*time.Second, "the reader past its bound", func() bool { return tailHolds(ts, topic, 0, 2000) })
	r := ts.srv.tails.get(partKey{topic, 0})
	require.NotNil(t, r)
	r.mu.Lock()
	held := r.held.len()
	r.mu.Unlock()
	require.Greater(t, held, 900, "the reader holds its bound's worth")
	require.Less(t, held, 2000, "the reader keeps its bound")

	const reads = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range reads {
		_, err := sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: fmt.Appendf(nil, "record-%09d", 2000+i)}}, nil)
		require.NoError(t, err)
		hub.NotifyPartitions(topic, 0)
		testdb.WaitFor(t, 10*time.Second, "the reader's read", func() bool { return tailHolds(ts, topic, 0, int64(2001+i)) })
	}
	runtime.ReadMemStats(&after)
	perRead := int64(after.TotalAlloc-before.TotalAlloc) / reads
	t.Logf("%d bytes allocated a read (the test's appends and waits included), the reader holding %d records", perRead, held)
	// A copy of what it holds would be held × 248 bytes, about 250 KB.
	require.Less(t, perRead, int64(64<<10), "bytes allocated per read at the bound")
}

// TestTailReaderOfLargeRecordsHoldsWhatItCounts: a reader at its bound holding large
// records (100 KiB each, ten of them within tailMaxBytes, one read each) keeps no
// more heap than it counts: the records it dropped are released, not kept alive by
// the block that holds them (a block closes once its records count tailBlockBytes;
// before blocks, the one slice's doubling left up to as many dropped records as kept
// ones, twice the bound). Not parallel: it measures the heap.
func TestTailReaderOfLargeRecordsHoldsWhatItCounts(t *testing.T) {
	sn := newTailScene(t, "tailmemlarge")
	ts, hub, ctx, topic, sc := sn.ts, sn.hub, sn.ctx, sn.topic, sn.sc
	sn.startReader(t, newClient(t, []string{ts.addr}))
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)

	const n, size = 60, 100 << 10
	worst, worstCounted := int64(0), 0
	for i := range n {
		_, err := sc.AppendPartition(ctx, topic, 0, []streams.Record{{Bytes: make([]byte, size)}}, nil)
		require.NoError(t, err)
		hub.NotifyPartitions(topic, 0)
		testdb.WaitFor(t, 10*time.Second, "the reader's read", func() bool { return tailHolds(ts, topic, 0, int64(i+1)) })
		r := ts.srv.tails.get(partKey{topic, 0})
		require.NotNil(t, r)
		r.mu.Lock()
		counted := r.bytes
		r.mu.Unlock()
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		if over := int64(m.HeapAlloc) - int64(base.HeapAlloc) - int64(counted); over > worst {
			worst, worstCounted = over, counted
		}
	}
	t.Logf("at worst the heap held %d bytes more than the reader counted (%d)", worst, worstCounted)
	// Two dropped records more than counted would be 200 KiB; the test's own buffers
	// (a read's decoding, the append's encoding) are about a record or two.
	require.LessOrEqual(t, worst, int64(512<<10), "heap beyond what the reader counted (%d bytes)", worstCounted)
}
