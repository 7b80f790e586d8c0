package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/localpg"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestMain lets a test start this binary as a real streamd process: with
// STREAMD_TEST_AS_MAIN=1 the test binary runs main() with the arguments after "--".
func TestMain(m *testing.M) {
	if os.Getenv("STREAMD_TEST_AS_MAIN") == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"streamd"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startStreamd starts a streamd serve child process.
func startStreamd(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--", "serve", "--http-addr", addr,
		"--auth-token", "ha-test-token-0123456789", "--coordinator-name", name}, args...)...)
	cmd.Env = append(os.Environ(), "STREAMD_TEST_AS_MAIN=1", localpg.EnvDatabaseURL+"="+testdb.URL(t))
	var logs testdb.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		if t.Failed() {
			t.Logf("streamd %d output:\n%s", cmd.Process.Pid, logs.String())
		}
	})
	return cmd
}

// TestTwoInstancesOneLeaderTakeoverOncePerCycle: two streamd processes elect one
// leader; kill -9 of the leader hands leadership to the other within about the lease
// TTL, and the leader's job runs exactly once for every schedule slot throughout.
func TestTwoInstancesOneLeaderTakeoverOncePerCycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	name := testdb.Name("ha")
	job := name + "/retention"
	// Slots of 3 s: the takeover (about the 1 s TTL, longer on a loaded machine) must
	// land inside the slot the killed leader last ran, or the next slot is skipped;
	// 1.5 s slots failed at load 13–22.
	args := []string{"--lease-ttl", "1s", "--reaper-interval", "3s", "--retention-interval", "3s"}
	// A stream with a count policy: the retention job must enforce it.
	s := testdb.Name("ha-retained")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, s, 1))
	for i := 0; i < 20; i++ {
		_, err := sc.Produce(ctx, streams.Record{Stream: s, Data: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, "INSERT INTO streamd.retention_policies (stream_name, max_event_count) VALUES ($1, 5)", s)
	require.NoError(t, err)
	// Only this test's stream: other packages' tests keep policies in the same database.
	args = append(args, "--retention-streams", s)
	procs := map[int]*exec.Cmd{}
	for i := 0; i < 2; i++ {
		c := startStreamd(t, name, args...)
		procs[c.Process.Pid] = c
	}
	leaderPid := func() int {
		var holder string
		err := pool.QueryRow(ctx, "SELECT holder FROM streamd.leader_leases WHERE name = $1 AND expires_at > clock_timestamp()", name).Scan(&holder)
		if err != nil {
			return 0
		}
		parts := strings.Split(holder, "-")
		var pid int
		_, _ = fmt.Sscan(parts[len(parts)-2], &pid)
		return pid
	}
	finished := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.coordinator_runs WHERE job = $1 AND finished_at IS NOT NULL", job).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return procs[leaderPid()] != nil && finished() >= 2 }, 60*time.Second, 20*time.Millisecond)
	first := leaderPid()
	require.NoError(t, procs[first].Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	var second int
	require.Eventually(t, func() bool {
		second = leaderPid()
		return second != 0 && second != first
	}, 10*time.Second, 10*time.Millisecond)
	t.Logf("takeover %v after kill -9 (lease TTL 1s)", time.Since(killed))
	before := finished()
	require.Eventually(t, func() bool { return finished() >= before+2 }, 30*time.Second, 50*time.Millisecond)

	rows, err := pool.Query(ctx, "SELECT slot, holder FROM streamd.coordinator_runs WHERE job = $1 AND finished_at IS NOT NULL ORDER BY slot", job)
	require.NoError(t, err)
	defer rows.Close()
	var slots []int64
	holders := map[string]bool{}
	for rows.Next() {
		var slot int64
		var holder string
		require.NoError(t, rows.Scan(&slot, &holder))
		slots = append(slots, slot)
		holders[holder] = true
	}
	require.NoError(t, rows.Err())
	for i := 1; i < len(slots); i++ {
		require.Equal(t, slots[i-1]+1, slots[i], "every slot ran, once (slots %v)", slots)
	}
	require.Len(t, holders, 2, "both processes led")

	var kept int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.events WHERE stream_name = $1", s).Scan(&kept))
	require.Equal(t, 5, kept, "the leader's retention job enforced the policy")
	var reaped int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM streamd.coordinator_runs WHERE job = $1 AND finished_at IS NOT NULL",
		name+"/stale-member-reaper").Scan(&reaped))
	require.Positive(t, reaped, "the reaper ran too")
}
