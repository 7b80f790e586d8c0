package streams

import (
	"bytes"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestFetchPayloadBuffersFitTheRows: a fetch's payload buffers are sized for what it
// reads: one small record takes one buffer of payloadFirst (not 64 KB, which a
// reader at its log end allocated and zeroed on every one-record read), and 500
// records of 100 bytes take that first buffer and one sized for the other 499 (not
// seven doubling ones). Every kept payload stays as it was copied.
func TestFetchPayloadBuffersFitTheRows(t *testing.T) {
	for _, tc := range []struct {
		rows, size    int
		buffers, over int // at most this many buffers, at most over bytes of them unused
	}{
		{1, 7, 1, payloadFirst},
		{500, 100, 2, payloadFirst},
		{3, 5000, 2, 0}, // a first row larger than payloadFirst gets a buffer of its size
	} {
		d := &fetchDecoder{}
		var kept [][]byte
		arrays := map[uintptr]int{} // backing array → its capacity
		for i := range tc.rows {
			b := bytes.Repeat([]byte{byte(i)}, tc.size)
			k := d.keep(b)
			kept = append(kept, k)
			if i == 0 {
				d.expect(tc.rows)
			}
			arrays[uintptr(unsafe.Pointer(unsafe.SliceData(d.payload)))] = cap(d.payload)
		}
		total := 0
		for _, c := range arrays {
			total += c
		}
		require.LessOrEqual(t, len(arrays), tc.buffers, "%d rows of %d bytes: buffers", tc.rows, tc.size)
		require.LessOrEqual(t, total, tc.rows*tc.size+tc.over, "%d rows of %d bytes: bytes allocated", tc.rows, tc.size)
		for i, k := range kept {
			require.Equal(t, bytes.Repeat([]byte{byte(i)}, tc.size), k, "row %d", i)
		}
	}
}
