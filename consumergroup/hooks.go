package consumergroup

import "sync/atomic"

// testHooks are the points where a test reaches into a Consumer. A test sets them
// through the unexported Config.hooks; a program's Consumer has none (nil), and every
// method is a no-op on nil.
type testHooks struct {
	// beforeHeartbeat runs before each heartbeat; a test freezes the member by
	// blocking in it.
	beforeHeartbeat func()
	// killed makes Run return as if the process died: no leave, no hooks.
	killed atomic.Bool
}

func (h *testHooks) heartbeat() {
	if h != nil && h.beforeHeartbeat != nil {
		h.beforeHeartbeat()
	}
}

func (h *testHooks) isKilled() bool { return h != nil && h.killed.Load() }
