package kafka

import (
	"context"
	"reflect"
	"time"

	"github.com/streamd/streamd/wakeup"
)

// The seam between long polls and the wake-up mechanism (the wakeup package today):
// a fetch subscribes to the streams it reads, reads, and waits on the subscriptions
// until something may have been committed, polling as the safety net.

// subscriptions are a long poll's wake-up subscriptions, one per stream.
type subscriptions struct {
	subs []*wakeup.Subscription
}

// subscribe subscribes to each stream (all partitions) of names; with no hub it
// holds none, and waits only poll.
func (s *Server) subscribe(names []string) *subscriptions {
	out := &subscriptions{}
	if s.cfg.Wakeups == nil {
		return out
	}
	for _, n := range names {
		out.subs = append(out.subs, s.cfg.Wakeups.Subscribe(wakeup.KindStream, n))
	}
	return out
}

func (w *subscriptions) close() {
	for _, s := range w.subs {
		s.Close()
	}
}

// wait blocks until a wake-up (true), or d passed, or ctx or stop ended (false).
func (w *subscriptions) wait(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	cases := make([]reflect.SelectCase, 0, len(w.subs)+3)
	cases = append(cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(stop)},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(t.C)})
	for _, s := range w.subs {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.C)})
	}
	chosen, _, _ := reflect.Select(cases)
	return chosen >= 3
}
