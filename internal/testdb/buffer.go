package testdb

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent use: a child process's stdout and
// stderr (whose exec copy goroutines outlive Process.Wait), or a command's output
// read by the test while it still writes.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
