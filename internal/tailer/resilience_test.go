package tailer_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/tailer"
	"github.com/streamd/streamd/internal/tailer/tailertest"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// Environment of the child process of TestKill9LeavesNoSlot.
const (
	envChildURL = "STREAMD_TAILER_CHILD_URL"
	envChildApp = "STREAMD_TAILER_CHILD_APP"
)

// TestMain runs a tailer and nothing else when the test binary is re-executed as the
// child of TestKill9LeavesNoSlot.
func TestMain(m *testing.M) {
	if url := os.Getenv(envChildURL); url != "" {
		os.Exit(runChild(url, os.Getenv(envChildApp)))
	}
	code := m.Run()
	tailertest.StopShared()
	os.Exit(code)
}

// runChild streams until killed, printing "streaming" once it is.
func runChild(url, app string) int {
	tl, err := tailer.New(&tailer.Config{
		ApplicationName: app,
		ConnString:      url,
		Handler:         func(context.Context, tailer.Event) {},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	go func() { // owner: the child's main; the process is killed, never stopped
		for tl.State() != tailer.StateStreaming {
			time.Sleep(5 * time.Millisecond)
		}
		fmt.Println("streaming")
	}()
	if err := tl.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// TestKill9LeavesNoSlot: a process running a tailer is killed with SIGKILL (no
// cleanup code runs); its replication slot was temporary, so the server drops it and
// nothing pins WAL; a tailer started in its place delivers again.
func TestKill9LeavesNoSlot(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	app := testdb.Name("tailer-kill9")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChildURL+"="+tailertest.Shared(t), envChildApp+"="+app)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	ready := make(chan bool, 1)
	go func() { // owner: this test; ends when the child's stdout closes
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "streaming" && !ok {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		require.True(t, ok, "the child exited before streaming")
	case <-time.After(90 * time.Second):
		t.Fatal("the child did not start streaming within 90s")
	}
	slot, temporary, _ := slotOf(t, pool, app)
	require.NotEmpty(t, slot, "the child's slot exists while it runs")
	require.True(t, temporary)

	require.NoError(t, cmd.Process.Kill()) // SIGKILL
	killed = true
	_ = cmd.Wait()
	testdb.WaitFor(t, 30*time.Second, "slot "+slot+" dropped", func() bool {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&n))
		return n == 0
	})

	// A tailer started in its place (a restarted process) delivers again.
	stream := createStream(t, pool, 1)
	rec := newRecorder(stream)
	startTailer(t, tailertest.Shared(t), rec, nil)
	_, err = streams.NewClient(pool, nil).Produce(context.Background(), streams.Record{Stream: stream, Data: []byte(`{}`)})
	require.NoError(t, err)
	testdb.WaitFor(t, 10*time.Second, "a commit handed on by the new tailer", func() bool {
		return rec.targets()[tailer.Target{Kind: tailer.KindStream, Name: stream}] == 1
	})
}

// TestWalsenderTerminatedReconnects: when the server ends the replication
// connection (pg_terminate_backend of the walsender), the tailer reconnects by
// itself with a new temporary slot (the old one is gone), tells its handler that
// commits may have been missed, and hands on commits again.
func TestWalsenderTerminatedReconnects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testPool(t)
	stream := createStream(t, pool, 2)
	rec := newRecorder(stream)
	app := testdb.Name("tailer-cut")
	tl := startTailer(t, tailertest.Shared(t), rec, func(c *tailer.Config) { c.ApplicationName = app })
	require.EqualValues(t, 1, tl.Sessions())
	require.Equal(t, 1, rec.allCount(), "streaming start wakes everyone")
	c := streams.NewClient(pool, nil)

	for cut := 1; cut <= 2; cut++ {
		slot, _, _ := slotOf(t, pool, app)
		require.NotEmpty(t, slot)
		var terminated bool
		require.NoError(t, pool.QueryRow(ctx,
			"SELECT pg_terminate_backend(pid) FROM pg_stat_replication WHERE application_name = $1", app).Scan(&terminated))
		require.True(t, terminated)
		testdb.WaitFor(t, 90*time.Second, "a new session", func() bool {
			return tl.Sessions() == int64(cut+1) && tl.State() == tailer.StateStreaming
		})
		require.Equal(t, cut+1, rec.allCount(), "each new session wakes everyone")
		testdb.WaitFor(t, 10*time.Second, "old slot dropped", func() bool {
			var n int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&n))
			return n == 0
		})
		p := int32(cut % 2)
		_, err := c.Produce(ctx, streams.Record{Stream: stream, Partition: streams.PartitionOf(p), Data: []byte(`{}`)})
		require.NoError(t, err)
		want := tailer.Target{Kind: tailer.KindStream, Name: stream, Partition: p}
		testdb.WaitFor(t, 10*time.Second, "a commit after the cut handed on", func() bool { return rec.targets()[want] >= 1 })
	}
}

// TestConfigNamesTheBadField: validation errors say which field is wrong.
func TestConfigNamesTheBadField(t *testing.T) {
	t.Parallel()
	h := func(context.Context, tailer.Event) {}
	for _, tc := range []struct {
		cfg  tailer.Config
		want string
	}{
		{tailer.Config{Handler: h}, "ConnString"},
		{tailer.Config{ConnString: "x"}, "Handler"},
		{tailer.Config{ConnString: "x", Handler: h, MinBackoff: time.Second, MaxBackoff: time.Millisecond}, "MaxBackoff"},
		{tailer.Config{ConnString: "x", Handler: h, StatusInterval: -1}, "StatusInterval"},
	} {
		_, err := tailer.New(&tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}

// TestStreamingOnlyAfterTheWakeUpForAll: a session shows as streaming only once its
// handler has had the wake-up for everything (Event.All), so whoever sees
// StateStreaming or Sessions go up may count on that wake-up having been handed on.
// The handler here holds the All event until the test has looked.
func TestStreamingOnlyAfterTheWakeUpForAll(t *testing.T) {
	t.Parallel()
	inAll := make(chan struct{}, 1)
	release := make(chan struct{})
	tl, err := tailer.New(&tailer.Config{
		ApplicationName: testdb.Name("tailer-order"),
		ConnString:      tailertest.Shared(t),
		Handler: func(ctx context.Context, ev tailer.Event) {
			if !ev.All {
				return
			}
			select {
			case inAll <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
			}
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tl.Run(ctx) }() // owner: this test; ends with cancel below
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	select {
	case <-inAll:
	case <-time.After(90 * time.Second):
		t.Fatal("no wake-up for everything within 90s")
	}
	require.NotEqual(t, tailer.StateStreaming, tl.State(), "streaming while the wake-up for everything is still being handed on")
	require.Zero(t, tl.Sessions())
	close(release)
	testdb.WaitFor(t, 30*time.Second, "streaming once the handler returned", func() bool {
		return tl.State() == tailer.StateStreaming && tl.Sessions() == 1
	})
}
