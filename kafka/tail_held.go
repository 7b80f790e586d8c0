package kafka

import (
	"sort"

	"github.com/streamd/streamd/streams"
)

// A tail reader's held records are kept in fixed blocks, so that neither a read's
// append nor the bounds' drop of the oldest copies the records it keeps. One slice
// that appends grew and drops resliced (or copied at a sixteenth of dropped records)
// copied the ~1,000 Events a reader of small records keeps about four times a second:
// 19 % of what a process serving a tail consumer allocated (session 16, kafka20).
const (
	// tailBlockEvents is the room of a block: a block is one allocation of this many
	// Events (248 bytes each), made when the last one is full (less for a reader
	// that holds fewer records, or for large records: push).
	tailBlockEvents = 64
	// tailBlockBytes closes a block early once the records in it count this much
	// (heldSize): a dropped record stays in its block until the whole block is
	// dropped or the dropped count a sixteenth of what the reader holds (then the
	// first block is copied without them: dropFirst), the bound the one slice kept by
	// copying (tailMaxBytes/16).
	tailBlockBytes = tailMaxBytes / 16
)

// heldRecords are a reader's records in offset order: blocks[0][head:], then the
// other blocks whole. A block's array is never written below its length (a fetch may
// hold a slice of it, see serve); a dropped block is left to the collector, not
// reused.
type heldRecords struct {
	blocks    [][]streams.Event
	head      int // the records of blocks[0] dropped
	n         int // the records held
	lastBytes int // heldSize of the last block's records
	bytes     int // heldSize of the records held
	dead      int // heldSize of the records dropped that blocks[0] still holds
}

// len returns the number of records held.
func (h *heldRecords) len() int { return h.n }

// first returns the oldest record held; h must hold one.
func (h *heldRecords) first() *streams.Event { return &h.blocks[0][h.head] }

// last returns the newest record held; h must hold one.
func (h *heldRecords) last() *streams.Event {
	b := h.blocks[len(h.blocks)-1]
	return &b[len(b)-1]
}

// push appends e, whose heldSize is size, after the records held.
func (h *heldRecords) push(e *streams.Event, size int) {
	if k := len(h.blocks); k == 0 || len(h.blocks[k-1]) == cap(h.blocks[k-1]) || h.lastBytes >= tailBlockBytes {
		// A block's room is what the reader may fill: no more than it holds already
		// (at least 4), nor than records of e's size close it at tailBlockBytes. A
		// block of 64 for a reader of one record, or for one record of 64 KiB, was
		// 15 KB of empty Events the bounds do not count, per reader.
		room := min(tailBlockEvents, max(4, h.n), tailBlockBytes/size+1)
		h.blocks = append(h.blocks, make([]streams.Event, 0, room))
		h.lastBytes = 0
	}
	k := len(h.blocks) - 1
	h.blocks[k] = append(h.blocks[k], *e)
	h.lastBytes += size
	h.bytes += size
	h.n++
}

// dropFirst drops the oldest record held; h must hold one. Its block goes when the
// block's last record does, or is copied without its dropped records once these
// count more than a sixteenth of what h holds: a reader left with a record or two
// (the log start moved, or the Server's total bound left it its last read) kept up
// to 64 KiB of dropped records and their Events, per reader, beyond the bounds.
func (h *heldRecords) dropFirst() {
	size := heldSize(h.first())
	h.head++
	h.n--
	h.bytes -= size
	h.dead += size
	if h.head < len(h.blocks[0]) {
		if h.dead > h.bytes/16 {
			// A copy: fetches may hold slices of the old array.
			h.blocks[0] = append([]streams.Event(nil), h.blocks[0][h.head:]...)
			h.head, h.dead = 0, 0
		}
		return
	}
	h.blocks[0] = nil
	h.blocks, h.head, h.dead = h.blocks[1:], 0, 0
	if len(h.blocks) == 0 {
		h.blocks, h.lastBytes = nil, 0
	}
}

// span returns at most limit records from the first held at offset or past it, and
// while each one past the first keeps their payload (Event.Size) within maxBytes.
// Records in one block are a slice of it, capped at its length (the block is never
// written there again); records across blocks are copied into a slice of their own.
func (h *heldRecords) span(offset int64, maxBytes, limit int) []streams.Event {
	// The first block whose last record is at offset or past it, then the record.
	b := sort.Search(len(h.blocks), func(b int) bool {
		blk := h.blocks[b]
		return blk[len(blk)-1].Offset >= offset
	})
	if b == len(h.blocks) {
		return nil
	}
	lo := 0
	if b == 0 {
		lo = h.head
	}
	blk := h.blocks[b]
	i := lo + sort.Search(len(blk)-lo, func(i int) bool { return blk[lo+i].Offset >= offset })
	// Count first: n records, the last in block eb before index ej.
	n, size, eb, ej := 0, 0, b, i
count:
	for bi, j := b, i; bi < len(h.blocks); bi, j = bi+1, 0 {
		for blk := h.blocks[bi]; j < len(blk); j++ {
			if n == limit {
				break count
			}
			sz := blk[j].Size()
			if n > 0 && size+sz > maxBytes {
				break count
			}
			size += sz
			n++
			eb, ej = bi, j+1
		}
	}
	if eb == b {
		return blk[i:ej:ej]
	}
	out := make([]streams.Event, 0, n)
	out = append(out, blk[i:]...)
	for bi := b + 1; bi < eb; bi++ {
		out = append(out, h.blocks[bi]...)
	}
	return append(out, h.blocks[eb][:ej]...)
}
