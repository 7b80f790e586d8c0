// Package backoff is streamd's one exponential backoff: reconnect loops (consumer,
// listeners, tailer, broadcaster), retries (producer, queue worker, handler retries)
// and the safety-net polls of long polls (wakeup.Poll) all wait through it.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is an exponential wait: the first Next returns Min, each later one twice
// the one before, up to Max. With Jitter, each wait is drawn from the upper half of
// its step ([d/2, d], "equal jitter"), so that many clients that failed together do
// not retry together. A Backoff is used by one goroutine; the zero value waits 0.
type Backoff struct {
	// Min is the first wait (and the wait after Reset).
	Min time.Duration
	// Max caps the wait; a Max below Min is taken as Min.
	Max time.Duration
	// Jitter draws each wait from [d/2, d] instead of d.
	Jitter bool

	cur time.Duration
}

// New returns a Backoff from min to max without jitter.
func New(min, max time.Duration) *Backoff { return &Backoff{Min: min, Max: max} }

// NewJittered returns a Backoff from min to max with jitter.
func NewJittered(min, max time.Duration) *Backoff { return &Backoff{Min: min, Max: max, Jitter: true} }

// Next returns the wait to use now and doubles the step for the next one.
func (b *Backoff) Next() time.Duration {
	if b.cur < b.Min {
		b.cur = b.Min
	}
	d := b.cur
	if b.cur *= 2; b.cur > max(b.Max, b.Min) {
		b.cur = max(b.Max, b.Min)
	}
	if b.Jitter && d > 1 {
		d = d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
	}
	return d
}

// Peek returns the step Next would start from, without jitter and without advancing.
func (b *Backoff) Peek() time.Duration { return max(b.cur, b.Min) }

// Reset makes the next wait Min again: call it after a success.
func (b *Backoff) Reset() { b.cur = b.Min }

// Wait sleeps Next(), and returns false when ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool { return Sleep(ctx, b.Next()) }

// Sleep waits d, and returns false when ctx ended first (at once when it already has).
func Sleep(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
