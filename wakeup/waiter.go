package wakeup

import (
	"context"
	"fmt"
	"time"

	"github.com/streamd/streamd/internal/backoff"
)

// PollOpts bounds the safety-net polling of a Waiter or Poll. A nil *PollOpts means
// the defaults.
type PollOpts struct {
	// MaxInterval is the longest wait without a wake-up: the safety-net poll's
	// period once backed off. Defaults to 1s.
	MaxInterval time.Duration
	// MinInterval is the first wait, and the wait after a wake-up or Reset; it
	// doubles after each wait that ends without a wake-up, up to MaxInterval.
	// Defaults to 10ms.
	MinInterval time.Duration
}

func (o *PollOpts) withDefaults() (PollOpts, error) {
	var out PollOpts
	if o != nil {
		out = *o
	}
	if out.MaxInterval == 0 {
		out.MaxInterval = time.Second
	}
	if out.MinInterval == 0 {
		out.MinInterval = 10 * time.Millisecond
	}
	return out, out.validate()
}

func (o *PollOpts) validate() error {
	switch {
	case o.MinInterval < 0:
		return fmt.Errorf("wakeup: PollOpts.MinInterval %v is negative", o.MinInterval)
	case o.MaxInterval < o.MinInterval:
		return fmt.Errorf("wakeup: PollOpts.MaxInterval %v is below MinInterval %v", o.MaxInterval, o.MinInterval)
	}
	return nil
}

// Waiter is a reader's wait between reads: it ends at a wake-up or at the current
// poll interval, whichever comes first, so delivery goes on by polling when no
// wake-ups come (tailer down, wal_level not logical) and at once when they do. It is
// the one wait of every long poll in streamd (Poll is its loop). A Waiter is used by
// one goroutine.
type Waiter struct {
	sub *Subscription
	bo  backoff.Backoff
}

// NewWaiter returns a Waiter on sub, starting at the shortest interval. A nil sub
// makes a Waiter that only polls. It fails when opts is invalid.
func NewWaiter(sub *Subscription, opts *PollOpts) (*Waiter, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Waiter{sub: sub, bo: backoff.Backoff{Min: o.MinInterval, Max: o.MaxInterval}}, nil
}

// Wait blocks until a wake-up (true; the next interval is the shortest again) or the
// current poll interval passes (false, and the next interval doubles), or ctx ends
// (false). Read after it returns either way.
func (w *Waiter) Wait(ctx context.Context) bool { return w.wait(ctx, -1, nil) }

// WaitOr is Wait that also ends when also delivers: a read someone else asks for
// (false; the poll interval stays as it was). A nil also never delivers.
func (w *Waiter) WaitOr(ctx context.Context, also <-chan struct{}) bool {
	return w.wait(ctx, -1, also)
}

// wait is WaitOr that also ends after limit, when limit is not negative.
func (w *Waiter) wait(ctx context.Context, limit time.Duration, also <-chan struct{}) bool {
	d := w.bo.Peek()
	if limit >= 0 && limit < d {
		d = limit
	}
	switch waitEnd(ctx, w.sub, d, also) {
	case woken:
		w.bo.Reset()
		return true
	case timedOut, canceled:
		w.bo.Next()
	}
	return false
}

// Reset makes the next poll interval the shortest again; call it after a read that
// found something.
func (w *Waiter) Reset() { w.bo.Reset() }

// Poll is the long poll of every reader in streamd (the log's Fetch, the queue's
// Receive, a consumer group's partition workers, the Kafka fetch): it calls try at
// once, then again after each wake-up of sub or poll interval, until try reports
// done or fails, ctx ends, or deadline passes. Subscribe sub before calling Poll, so
// that a commit between an empty try and the wait still ends the wait; a nil sub
// polls only.
//
// Poll returns try's error as it is; ctx's error when ctx ended first (try is not
// called again then); nil when try reported done or the deadline passed (try's last
// call came at or after it). It fails at once when opts is invalid.
func Poll(ctx context.Context, sub *Subscription, deadline time.Time, opts *PollOpts, try func() (done bool, err error)) error {
	w, err := NewWaiter(sub, opts)
	if err != nil {
		return err
	}
	for {
		done, err := try()
		if err != nil || done {
			return err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil
		}
		w.wait(ctx, left, nil)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}
