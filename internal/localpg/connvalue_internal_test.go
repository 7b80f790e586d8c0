package localpg

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestConnValueQuotes: a socket directory with a space (a checkout under "My
// Projects") is quoted in the connection string, which pgx then parses back whole.
func TestConnValueQuotes(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{"/tmp/run", "/home/me/My Projects/streamd/.state/pg/run", `/tmp/it's`} {
		c := &Cluster{cfg: Config{Port: 5432}, sockDir: dir}
		cfg, err := pgconn.ParseConfig(c.URL("x"))
		require.NoError(t, err, dir)
		require.Equal(t, dir, cfg.Host)
		require.Equal(t, "x", cfg.Database)
	}
}

// TestStaleLockFileRemoved: a postmaster.pid naming a process that is not PostgreSQL
// (here this test, alive; or no process at all) is removed, so that pg_ctl neither
// takes the cluster for running nor signals that process; one naming a PostgreSQL
// process stays.
func TestStaleLockFileRemoved(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	lock := filepath.Join(dir, "postmaster.pid")
	for _, pid := range []int{os.Getpid(), 1 << 22} {
		require.NoError(t, os.WriteFile(lock, []byte(fmt.Sprintf("%d\n%s\n", pid, dir)), 0o600))
		require.True(t, removeStaleLockFile(dir), "pid %d", pid)
		_, err := os.Stat(lock)
		require.ErrorIs(t, err, os.ErrNotExist)
	}
	// A real server's lock file: the one of the cluster the tests run on.
	if pg := findPostgresPID(t); pg > 0 {
		require.NoError(t, os.WriteFile(lock, []byte(fmt.Sprintf("%d\n%s\n", pg, dir)), 0o600))
		require.False(t, removeStaleLockFile(dir))
	}
}

// findPostgresPID returns the PID of some running postgres process, or 0.
func findPostgresPID(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && strings.Contains(string(b), "postgres") {
			return pid
		}
	}
	return 0
}
