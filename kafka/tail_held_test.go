package kafka

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/streams"
)

// TestHeldRecordsAtTheBoundCopyNothing: a reader's held records at their bound (a
// record pushed and the oldest dropped, as a reader of one record per wake-up does
// once it holds ~1,000 small records) allocate about an Event per record, a block at a
// time: appending and dropping copy none of the records kept. The one slice that
// appends grew and drops resliced (copying what it kept at a sixteenth of dropped
// records) allocated about 4 KB a record (session 16, kafka20: 19 % of what the
// end-to-end bench's process allocated). Not parallel: it measures the heap.
func TestHeldRecordsAtTheBoundCopyNothing(t *testing.T) {
	const kept, pushes = 1000, 20000
	var h heldRecords
	payload := []byte("record-000000000") // 16 bytes: heldSize 1,040
	e := streams.Event{Bytes: payload}
	push := func(off int64) {
		e.Offset = off
		h.push(&e, heldSize(&e))
		for h.len() > kept {
			h.dropFirst()
		}
	}
	for off := range int64(kept) {
		push(off)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for off := int64(kept); off < kept+pushes; off++ {
		push(off)
	}
	runtime.ReadMemStats(&after)
	perRecord := float64(after.TotalAlloc-before.TotalAlloc) / pushes
	eventSize := float64(unsafe.Sizeof(streams.Event{}))
	t.Logf("%.0f bytes allocated a record pushed at the bound (an Event is %.0f)", perRecord, eventSize)
	require.Less(t, perRecord, 1.25*eventSize, "bytes allocated per record at the bound")
	require.Equal(t, kept, h.len())
	require.Equal(t, int64(pushes), h.first().Offset)
	require.Equal(t, int64(kept+pushes-1), h.last().Offset)
}

// TestHeldRecordsSpan: span answers what one slice of the held records would (the
// records from the first at the offset or past it, at least one, within maxBytes and
// the record limit), within a block and across blocks (blocks closed by their room
// and by tailBlockBytes, offsets with gaps, the oldest dropped), and a span within a
// block is capped at its length, so that a later push cannot write into it.
func TestHeldRecordsSpan(t *testing.T) {
	var h heldRecords
	var all []streams.Event
	for i := range 300 {
		size := 10 + i%7*3
		if i%50 == 49 {
			size = 40 << 10 // closes its block early
		}
		e := streams.Event{Offset: int64(2 * i), Bytes: make([]byte, size)}
		h.push(&e, heldSize(&e))
		all = append(all, e)
	}
	for range 37 {
		h.dropFirst()
	}
	all = all[37:]
	closedByBytes := 0
	for _, blk := range h.blocks[:len(h.blocks)-1] {
		if len(blk) < cap(blk) {
			closedByBytes++
		}
	}
	require.Greater(t, closedByBytes, 0, "some blocks closed by their bytes")
	want := func(offset int64, maxBytes, limit int) []streams.Event {
		i := 0
		for i < len(all) && all[i].Offset < offset {
			i++
		}
		n, size := 0, 0
		for i+n < len(all) && n < limit {
			sz := all[i+n].Size()
			if n > 0 && size+sz > maxBytes {
				break
			}
			size += sz
			n++
		}
		return all[i : i+n]
	}
	offsets := []int64{all[0].Offset, all[0].Offset + 1, 150, 151, 255, all[len(all)-1].Offset, all[len(all)-1].Offset + 1}
	for _, off := range offsets {
		for _, mb := range []int{1, 50, 700, 5000, 100 << 10, 1 << 30} {
			for _, limit := range []int{1, 3, 64, 65, 1000} {
				got := h.span(off, mb, limit)
				exp := want(off, mb, limit)
				require.Equal(t, len(exp), len(got), "span(%d, %d, %d)", off, mb, limit)
				for k := range exp {
					require.Equal(t, exp[k].Offset, got[k].Offset, fmt.Sprintf("span(%d, %d, %d)[%d]", off, mb, limit, k))
				}
				require.Equal(t, len(got), cap(got), "a span is capped at its length")
			}
		}
	}
	// A push after a span of the last block's records does not write into the span.
	last := h.span(all[len(all)-1].Offset, 1<<30, 10)
	e := streams.Event{Offset: all[len(all)-1].Offset + 2}
	h.push(&e, heldSize(&e))
	require.Len(t, last, 1)
	require.Equal(t, all[len(all)-1].Offset, last[0].Offset)
	for h.len() > 0 {
		h.dropFirst()
	}
	require.Empty(t, h.blocks)
	require.Nil(t, h.span(0, 1<<30, 10))
}

// heldHeap is the heap a reader's held records keep alive: the blocks' arrays whole
// (their spare room and the Events dropped from the first block included) and the
// payloads of every Event those arrays still reference, dropped or not.
func heldHeap(h *heldRecords) int {
	n := 0
	for _, blk := range h.blocks {
		n += cap(blk) * int(unsafe.Sizeof(streams.Event{}))
		for i := range blk {
			n += blk[i].Size()
		}
	}
	return n
}

// TestHeldRecordsHoldWhatTheyCount: the heap a reader's records keep (heldHeap) is
// what the bounds count (heldSize of the records held) give or take a sixteenth, as
// the one slice kept it, whatever the reader holds: a reader that read one record,
// one that dropped all but the last of a block's records (the log start moved, or the
// Server's total bound left it its last read), a reader at its bound of small
// records, one of large records. A per-reader excess (a fresh block's 63 empty Events,
// 64 KiB of dropped records) is paid by each of up to tailMaxReaders readers, beyond
// tailTotalBytes.
func TestHeldRecordsHoldWhatTheyCount(t *testing.T) {
	type step struct {
		payload, push, keep int // push records of payload bytes, then drop down to keep
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"one small record", []step{{16, 1, 1}}},
		{"a block's records dropped but the last", []step{{1 << 10, 32, 1}}},
		{"two reads, the first dropped", []step{{1 << 10, 20, 20}, {16, 1, 1}}},
		{"small records at the bound", append([]step{{16, 1000, 1000}}, slices.Repeat([]step{{16, 1, 1000}}, 2000)...)},
		{"large records at the bound", append([]step{{100 << 10, 10, 10}}, slices.Repeat([]step{{100 << 10, 1, 10}}, 20)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h heldRecords
			counted, off := 0, int64(0)
			for _, s := range tc.steps { // a read: its records pushed, then the oldest dropped
				for range s.push {
					e := streams.Event{Offset: off, Bytes: make([]byte, s.payload)}
					off++
					h.push(&e, heldSize(&e))
					counted += heldSize(&e)
				}
				for h.len() > s.keep {
					counted -= heldSize(h.first())
					h.dropFirst()
				}
			}
			heap := heldHeap(&h)
			t.Logf("%d records counted as %d bytes keep %d", h.len(), counted, heap)
			require.LessOrEqual(t, heap, counted+counted/16, "heap the held records keep against what they count")
		})
	}
}
