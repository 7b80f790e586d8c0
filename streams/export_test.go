package streams

import (
	"context"
	"time"
)

// CopyAppends returns how many batches were appended with COPY so far. Tests only.
func CopyAppends() int64 { return copyAppends.Load() }

// InsertAppends returns how many batches were appended by the one-statement path
// (insertSQL) so far. Tests only.
func InsertAppends() int64 { return insertAppends.Load() }

// FetchDecodesItself reports whether a Fetch on db decodes its rows itself (the
// formats db's connections get allow it) rather than through pgx's Scan. Tests only.
func FetchDecodesItself(ctx context.Context, db DBTX) (bool, error) {
	rows, err := db.Query(ctx, fetchSQL, "-", int32(0), int64(0), int64(1), int64(1))
	if err != nil {
		return false, err
	}
	defer rows.Close()
	return newFetchDecoder(rows).fast, nil
}

// InsertSQL is the one-statement path's statement. Tests only.
var InsertSQL = insertSQL

// OneSQL is the one-statement path's statement for a single record. Tests only.
var OneSQL = oneSQL

// CoalescedAppends returns how many Produce calls were appended in a transaction
// shared with other calls so far. Tests only.
func CoalescedAppends() int64 { return coalescedAppends.Load() }

// AppendsWaiting returns how many of c's Produce calls wait for a transaction to
// share. Tests only.
func (c *Client) AppendsWaiting() int {
	if c.appends == nil {
		return 0
	}
	c.appends.mu.Lock()
	defer c.appends.mu.Unlock()
	return len(c.appends.pending)
}

// AppendsRunning returns how many transactions of c's shared Produce calls run, and
// how many of them count as stalled. Tests only.
func (c *Client) AppendsRunning() (running, stalled int) {
	if c.appends == nil {
		return 0, 0
	}
	c.appends.mu.Lock()
	defer c.appends.mu.Unlock()
	return c.appends.inFlight, c.appends.stalled
}

// InsertStatement returns the one-statement path's statement and arguments for recs,
// all to stream and partition and all with an event id. Tests only.
func InsertStatement(stream string, partition int32, recs []Record) (string, []any, error) {
	st, err := newInsertStatement(stream, partition, recs)
	return st.sql, st.args, err
}

// SetAppendStallAfter sets how long a transaction of c's shared Produce calls runs
// before it no longer counts against MaxAppendsInFlight (appendStallAfter). Tests
// that hold a transaction on a lock to make calls wait behind it set it longer.
// Call it before c's first Produce. Tests only.
func (c *Client) SetAppendStallAfter(d time.Duration) {
	if c.appends != nil {
		c.appends.stallAfter = d
	}
}
