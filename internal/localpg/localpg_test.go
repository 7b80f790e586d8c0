package localpg_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/localpg"
)

func freePort(t *testing.T) int {
	t.Helper()
	port, err := localpg.FreePort()
	require.NoError(t, err)
	return port
}

// stateDir returns a fresh folder the postgres user can reach when we run as root.
func stateDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	return filepath.Join(dir, "state")
}

// TestEnsureFromNothingThenReuse: a cluster is created in an empty state folder with
// wal_level=logical, the next Ensure reuses the running server, and Stop stops it.
func TestEnsureFromNothingThenReuse(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := &localpg.Config{StateDir: stateDir(t), Port: freePort(t)}
	t.Cleanup(func() { _ = localpg.Stop(context.Background(), cfg) })

	c, err := localpg.Ensure(ctx, cfg)
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(c.DataDir(), "PG_VERSION"))
	require.NoError(t, c.CreateDatabase(ctx, "streamd"))
	require.NoError(t, c.CreateDatabase(ctx, "streamd"), "creating an existing database succeeds")

	conn, err := pgx.Connect(ctx, c.URL("streamd"))
	require.NoError(t, err)
	var walLevel string
	var pid1 int
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('wal_level'), pg_backend_pid()").Scan(&walLevel, &pid1))
	require.Equal(t, "logical", walLevel)
	var started1 time.Time
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&started1))
	conn.Close(ctx)

	// Reused: the same postmaster, not a new one.
	c2, err := localpg.Ensure(ctx, cfg)
	require.NoError(t, err)
	conn, err = pgx.Connect(ctx, c2.URL("streamd"))
	require.NoError(t, err)
	var started2 time.Time
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&started2))
	conn.Close(ctx)
	require.Equal(t, started1, started2)

	require.NoError(t, localpg.Stop(ctx, cfg))
	_, err = pgx.Connect(ctx, c.URL("streamd"))
	require.Error(t, err, "stopped")
	// Started again from the kept data.
	c3, err := localpg.Ensure(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, c3.WaitReady(ctx))
}

// TestMissingBinariesSaysWhatIsMissing: without the server binaries, Ensure fails with
// ErrMissingBinaries and a message naming what to install and the alternative.
func TestMissingBinariesSaysWhatIsMissing(t *testing.T) {
	t.Parallel()
	cfg := &localpg.Config{StateDir: stateDir(t), Port: freePort(t), BinDir: t.TempDir()}
	_, err := localpg.Ensure(context.Background(), cfg)
	require.ErrorIs(t, err, localpg.ErrMissingBinaries)
	for _, want := range []string{"initdb", "pg_ctl", "postgres", "apt-get install postgresql", localpg.EnvDatabaseURL} {
		require.True(t, strings.Contains(err.Error(), want), "error %q should mention %q", err, want)
	}
}
