package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/localpg"
	"github.com/streamd/streamd/internal/testdb"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// binary builds streamd once per test process and returns its path.
func binary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "streamd-bin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "streamd")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = &buildError{err: err, out: string(out)}
		}
	})
	require.NoError(t, binErr)
	return binPath
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return "go build: " + e.err.Error() + ": " + e.out }

// userEnv is the environment of a user with no STREAMD_STATE_DIR and no database URL
// whose per-user state folder ($XDG_STATE_HOME/streamd) is the test cluster's.
func userEnv(t *testing.T) []string {
	t.Helper()
	cluster := testdb.Cluster(t)
	xdg, err := os.MkdirTemp("", "xdg")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(xdg) })
	require.NoError(t, os.Symlink(cluster.StateDir(), filepath.Join(xdg, "streamd")))
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k == localpg.EnvStateDir || k == localpg.EnvDatabaseURL || k == "XDG_STATE_HOME" || k == localpg.EnvPort {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "XDG_STATE_HOME="+xdg, localpg.EnvPort+"="+strconv.Itoa(cluster.Port()))
}

// runBinary runs the built streamd in dir with env and returns stdout and stderr.
func runBinary(t *testing.T, dir string, env []string, stdin string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Dir, cmd.Env, cmd.Stdin = dir, env, strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// TestBinaryFromAnotherDirectoryFindsTheSameDatabase: the built binary, run without
// STREAMD_STATE_DIR from two unrelated directories, uses one private cluster (the
// user's) and one database: a stream created from one is listed from the other, and
// is in the cluster's streamd database. Run outside the checkout it used to make a
// second, empty cluster. streamd db url names the folder and the port.
func TestBinaryFromAnotherDirectoryFindsTheSameDatabase(t *testing.T) {
	t.Parallel()
	env := userEnv(t)
	a, b := t.TempDir(), t.TempDir()
	s := testdb.Name("anydir")

	_, stderr, err := runBinary(t, a, env, "", "stream", "create", s, "--partitions", "2")
	require.NoError(t, err, stderr)
	out, stderr, err := runBinary(t, b, env, "", "stream", "list", "-O", "json")
	require.NoError(t, err, stderr)
	require.Contains(t, out, `"`+s+`"`, "listed from another directory")

	urlA, infoA, err := runBinary(t, a, env, "", "db", "url")
	require.NoError(t, err, infoA)
	urlB, _, err := runBinary(t, b, env, "", "db", "url")
	require.NoError(t, err)
	require.Equal(t, urlA, urlB)
	require.Contains(t, infoA, testdb.Cluster(t).StateDir(), "db url names the state folder")
	require.Contains(t, infoA, "port "+strconv.Itoa(testdb.Cluster(t).Port()))

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.Cluster(t).URL(localpg.DefaultDatabase))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM streamd.streams WHERE stream_name = $1", s).Scan(&n))
	require.Equal(t, 1, n, "the stream is in the private cluster's streamd database")
}
