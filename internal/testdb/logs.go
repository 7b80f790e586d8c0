package testdb

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// Logs is a slog.Handler that counts the records it receives by message, so that a
// test can wait for something a component logs (a retry, say) instead of sleeping.
// It is safe for concurrent use.
type Logs struct {
	mu     sync.Mutex
	counts map[string]int
	change chan struct{} // closed and replaced on every record
}

// NewLogs returns an empty Logs.
func NewLogs() *Logs {
	return &Logs{counts: map[string]int{}, change: make(chan struct{})}
}

// Logger returns a logger that writes to l (every level).
func (l *Logs) Logger() *slog.Logger { return slog.New(l) }

// Count returns how many records had message msg.
func (l *Logs) Count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[msg]
}

// WaitFor waits until n records with message msg were logged, failing the test after
// 20 seconds.
func (l *Logs) WaitFor(t testing.TB, msg string, n int) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		l.mu.Lock()
		got, change := l.counts[msg], l.change
		l.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-change:
		case <-deadline:
			t.Fatalf("testdb: %d of %d log records %q within 20s", got, n, msg)
		}
	}
}

// Enabled implements slog.Handler: every level.
func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.counts[r.Message]++
	close(l.change)
	l.change = make(chan struct{})
	l.mu.Unlock()
	return nil
}

// WithAttrs implements slog.Handler (attributes are not kept).
func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler.
func (l *Logs) WithGroup(string) slog.Handler { return l }
