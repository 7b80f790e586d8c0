// Package tailertest starts private PostgreSQL clusters for the tailer's and the
// wake-ups' tests.
//
// Why not the shared test cluster: creating a logical replication slot waits until
// the transactions running at that moment have ended and the server has logged a
// snapshot of running transactions (every 15s, by the background writer), so under
// other tests' constant writes every (re)connect of a tailer would take 15 to 30
// seconds; and tests that restart the server or change wal_level must not disturb
// other tests.
package tailertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/localpg"
	schema "github.com/streamd/streamd/sql"
)

// settings keep test clusters small and fast; callers add or override.
var settings = map[string]string{
	"shared_buffers":  "32MB",
	"max_connections": "60",
	"fsync":           "off",
}

// Cluster starts a private cluster for one test, stopped when the test ends, with
// extra server settings (e.g. {"wal_level": "replica"}), and returns it and the URL
// of its migrated database "streamd".
func Cluster(t testing.TB, extra map[string]string) (*localpg.Cluster, string) {
	t.Helper()
	dir := t.TempDir()
	// t.TempDir is <tmp>/<TestName><n>/<nnn>: the server must reach both levels.
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatalf("tailertest: %v", err)
	}
	c, url, err := start(dir, extra)
	if err != nil {
		t.Fatalf("tailertest: %v", err)
	}
	t.Cleanup(func() { _ = localpg.Stop(context.Background(), c.cfg) })
	return c.Cluster, url
}

type started struct {
	*localpg.Cluster
	cfg *localpg.Config
}

var shared struct {
	once sync.Once
	dir  string
	c    *started
	url  string
	err  error
}

// Shared returns the URL of a private cluster shared by the tests of one package
// (started on first use, wal_level=logical). Call StopShared from TestMain.
func Shared(t testing.TB) string {
	t.Helper()
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "streamd-tailertest-")
		if shared.err == nil {
			shared.c, shared.url, shared.err = start(shared.dir, nil)
		}
	})
	if shared.err != nil {
		t.Fatalf("tailertest: shared cluster: %v", shared.err)
	}
	return shared.url
}

// StopShared stops the shared cluster, if it was started, and removes its files.
func StopShared() {
	if shared.c != nil {
		_ = localpg.Stop(context.Background(), shared.c.cfg)
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
}

func start(dir string, extra map[string]string) (*started, string, error) {
	if os.Getenv(localpg.EnvDatabaseURL) != "" {
		return nil, "", fmt.Errorf("these tests need the PostgreSQL server binaries for a private cluster; unset %s", localpg.EnvDatabaseURL)
	}
	// The server runs as the postgres user when we are root: it must reach the folder.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, "", err
	}
	all := map[string]string{}
	for k, v := range settings {
		all[k] = v
	}
	for k, v := range extra {
		all[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		cfg *localpg.Config
		c   *localpg.Cluster
	)
	// The free port is free when asked, not necessarily when the server binds it
	// (FreePort chooses outside the ephemeral range, but another test's cluster may
	// choose the same one). Take another then.
	for attempt := 1; ; attempt++ {
		port, err := localpg.FreePort()
		if err != nil {
			return nil, "", err
		}
		cfg = &localpg.Config{StateDir: filepath.Join(dir, "state"), Port: port, Settings: all}
		c, err = localpg.Ensure(ctx, cfg)
		if err == nil {
			break
		}
		if attempt == 3 || !errors.Is(err, localpg.ErrPortTaken) {
			return nil, "", err
		}
	}
	if err := c.CreateDatabase(ctx, "streamd"); err != nil {
		_ = localpg.Stop(ctx, cfg)
		return nil, "", err
	}
	url := c.URL("streamd")
	pool, err := pgxpool.New(ctx, url)
	if err == nil {
		_, err = schema.Migrate(ctx, pool)
		pool.Close()
	}
	if err != nil {
		_ = localpg.Stop(ctx, cfg)
		return nil, "", fmt.Errorf("migrate: %w", err)
	}
	return &started{Cluster: c, cfg: cfg}, url, nil
}
