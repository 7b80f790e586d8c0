package wakeup

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// WaiterOpts bounds a Waiter's polling. A nil *WaiterOpts means the defaults.
type WaiterOpts struct {
	// MaxInterval is the longest wait without a wake-up: the safety-net poll's
	// period once backed off. Defaults to 1s.
	MaxInterval time.Duration
	// MinInterval is the first wait after Reset; it doubles after each wait that
	// ends without a wake-up, up to MaxInterval. Defaults to 10ms.
	MinInterval time.Duration
}

// Waiter is a reader's wait between reads: it ends at a wake-up or at the current
// poll interval, whichever comes first, so delivery goes on by polling when no
// wake-ups come (tailer down, wal_level not logical) and at once when they do.
// A Waiter is used by one goroutine.
type Waiter struct {
	sub      *Subscription
	min, max time.Duration
	cur      time.Duration
}

// NewWaiter returns a Waiter on sub, starting at the shortest interval.
func NewWaiter(sub *Subscription, opts *WaiterOpts) (*Waiter, error) {
	o := WaiterOpts{}
	if opts != nil {
		o = *opts
	}
	if o.MaxInterval == 0 {
		o.MaxInterval = time.Second
	}
	if o.MinInterval == 0 {
		o.MinInterval = 10 * time.Millisecond
	}
	switch {
	case sub == nil:
		return nil, errors.New("wakeup: NewWaiter: sub is nil")
	case o.MinInterval < 0:
		return nil, fmt.Errorf("wakeup: WaiterOpts.MinInterval %v is negative", o.MinInterval)
	case o.MaxInterval < o.MinInterval:
		return nil, fmt.Errorf("wakeup: WaiterOpts.MaxInterval %v is below MinInterval %v", o.MaxInterval, o.MinInterval)
	}
	return &Waiter{sub: sub, min: o.MinInterval, max: o.MaxInterval, cur: o.MinInterval}, nil
}

// Wait blocks until a wake-up (true) or the current poll interval passes (false, and
// the next interval doubles), or ctx ends (false). Read after it returns either way.
func (w *Waiter) Wait(ctx context.Context) bool {
	if w.sub.Wait(ctx, w.cur) {
		return true
	}
	if w.cur *= 2; w.cur > w.max {
		w.cur = w.max
	}
	return false
}

// Reset makes the next poll interval the shortest again; call it after a read that
// found something.
func (w *Waiter) Reset() { w.cur = w.min }
