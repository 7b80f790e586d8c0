package testdb

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
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

// Child is this test binary started again as a child process (a member, a worker),
// for tests that kill, stop or freeze it while others go on.
type Child struct {
	Cmd *exec.Cmd
	// Stdin is the child's standard input (nil unless ChildOpts.Stdin).
	Stdin io.WriteCloser
	// Done is closed once the child has exited and its stdout has been read; Err is
	// then what Wait returned.
	Done   chan struct{}
	Err    error
	stderr bytes.Buffer
}

// ChildOpts says how StartChild starts a child.
type ChildOpts struct {
	// Env is added to the test's environment (the child's role and settings).
	Env []string
	// Stdin gives the child a standard input (Child.Stdin).
	Stdin bool
	// Line, if set, is called with each line the child prints, from one goroutine;
	// the last call returns before Done is closed.
	Line func(string)
}

// StartChild starts os.Args[0] with no tests to run and o.Env added. The test's
// cleanup resumes it (SIGCONT: a child a failed test left frozen), kills it, waits
// for it, and logs its stderr when the test failed.
func StartChild(t testing.TB, o ChildOpts) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), o.Env...)
	ch := &Child{Cmd: cmd, Done: make(chan struct{})}
	cmd.Stderr = &ch.stderr
	var err error
	if o.Stdin {
		if ch.Stdin, err = cmd.StdinPipe(); err != nil {
			t.Fatalf("testdb: child's stdin: %v", err)
		}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("testdb: child's stdout: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("testdb: start child: %v", err)
	}
	go func() { // owner: the child; ends when it exits
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if o.Line != nil {
				o.Line(sc.Text())
			}
		}
		ch.Err = cmd.Wait() // after the reads (os/exec's rule)
		close(ch.Done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-ch.Done
		if t.Failed() {
			t.Logf("child %d stderr:\n%s", cmd.Process.Pid, ch.stderr.String())
		}
	})
	return ch
}
