package messages

import "sync"

// hub is the in-process WakeupSource: a Client's Sends wake its own long polls.
type hub struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

func newHub() *hub { return &hub{subs: map[string]map[chan struct{}]struct{}{}} }

// Subscribe implements WakeupSource.
func (h *hub) Subscribe(queue string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.subs[queue] == nil {
		h.subs[queue] = map[chan struct{}]struct{}{}
	}
	h.subs[queue][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs[queue], ch)
		if len(h.subs[queue]) == 0 {
			delete(h.subs, queue)
		}
		h.mu.Unlock()
	}
}

// notify wakes every subscriber of queue without blocking.
func (h *hub) notify(queue string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[queue] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Notify wakes this Client's long polls on queue. Call it after committing a
// transaction that used SendTx, which cannot know when (or whether) its messages
// become visible.
func (c *Client) Notify(queue string) { c.local.notify(queue) }
