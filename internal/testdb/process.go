package testdb

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

// StopProcess stops the process pid with SIGSTOP and returns once every one of its
// threads is stopped (Linux: /proc/pid/task/*/stat in state T). kill(2) only queues the
// stop: one thread takes it when it next runs and only then asks the others to stop,
// so on a loaded machine another thread may run on for a while (make test once saw a
// child read the test's next line and COMMIT the transaction it was to be frozen in).
// It fails the test after 10 s.
func StopProcess(t testing.TB, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("testdb: SIGSTOP %d: %v", pid, err)
	}
	WaitFor(t, 10*time.Second, fmt.Sprintf("every thread of process %d stopped", pid), func() bool {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			t.Fatalf("testdb: threads of %d: %v", pid, err)
		}
		for _, task := range tasks {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			if errors.Is(err, os.ErrNotExist) {
				continue // the thread exited
			}
			if err != nil {
				t.Fatalf("testdb: thread state: %v", err)
			}
			// "tid (comm) state ...": comm may hold spaces and parentheses.
			i := bytes.LastIndexByte(stat, ')')
			if i <= 0 || i+2 >= len(stat) {
				t.Fatalf("testdb: unexpected %s", stat)
			}
			if state := stat[i+2]; state != 'T' && state != 't' {
				return false
			}
		}
		return true
	})
}
