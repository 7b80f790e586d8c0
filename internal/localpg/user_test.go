package localpg_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/localpg"
	"github.com/streamd/streamd/internal/testdb"
)

// TestPortTakenNamesTheHolder: a second cluster on the port of a running one is
// refused before anything is made, with an error that names the folder of the cluster
// holding the port and the two variables that choose another; a port held by some
// other process is named as such. It used to fail in pg_ctl start with "is another
// server using it?".
func TestPortTakenNamesTheHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := testdb.Cluster(t)
	dir := stateDir(t)
	_, err := localpg.Ensure(ctx, &localpg.Config{StateDir: dir, Port: cluster.Port()})
	require.ErrorContains(t, err, "port "+strconv.Itoa(cluster.Port())+" is taken by the private cluster of state folder "+cluster.StateDir())
	require.ErrorContains(t, err, localpg.EnvPort)
	require.ErrorContains(t, err, localpg.EnvStateDir)
	_, statErr := os.Stat(filepath.Join(dir, "pg", "data", "PG_VERSION"))
	require.ErrorIs(t, statErr, os.ErrNotExist, "nothing made")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	_, err = localpg.Ensure(ctx, &localpg.Config{StateDir: stateDir(t), Port: port})
	require.ErrorContains(t, err, "port "+strconv.Itoa(port)+" is taken by another process")
}

// TestDefaultStateDirIsPerUser: without STREAMD_STATE_DIR the state folder does not
// depend on the working directory.
func TestDefaultStateDirIsPerUser(t *testing.T) {
	t.Setenv(localpg.EnvStateDir, "")
	t.Setenv("XDG_STATE_HOME", "/somewhere")
	wd, err := os.Getwd()
	require.NoError(t, err)
	require.Equal(t, "/somewhere/streamd", localpg.DefaultStateDir())
	t.Chdir(t.TempDir())
	require.Equal(t, "/somewhere/streamd", localpg.DefaultStateDir())
	t.Chdir(wd)
	t.Setenv(localpg.EnvStateDir, "/chosen")
	require.Equal(t, "/chosen", localpg.DefaultStateDir())
}
