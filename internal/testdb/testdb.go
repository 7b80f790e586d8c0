// Package testdb gives tests a migrated PostgreSQL database: $STREAMD_DATABASE_URL
// when set, else the project's local cluster (internal/localpg), database streamd_test.
// It fails the test loudly when no database can be had; it never skips.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	neturl "net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/localpg"
	schema "github.com/streamd/streamd/sql"
)

// TestDatabase is the database the tests use in the local cluster.
const TestDatabase = "streamd_test"

var (
	once    sync.Once
	url     string
	cluster *localpg.Cluster
	initErr error
)

func setup() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if v := os.Getenv(localpg.EnvDatabaseURL); v != "" {
		url = v
	} else {
		cluster, initErr = localpg.Ensure(ctx, nil)
		if initErr != nil {
			return
		}
		if initErr = cluster.CreateDatabase(ctx, TestDatabase); initErr != nil {
			return
		}
		url = cluster.URL(TestDatabase)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		initErr = err
		return
	}
	defer pool.Close()
	_, initErr = schema.Migrate(ctx, pool)
}

// URL returns the test database's connection string, migrated.
func URL(t testing.TB) string {
	t.Helper()
	once.Do(setup)
	if initErr != nil {
		t.Fatalf("testdb: no test database (set %s or install the PostgreSQL server binaries): %v", localpg.EnvDatabaseURL, initErr)
	}
	return url
}

// Cluster returns the local cluster, or fails the test when the tests run against
// $STREAMD_DATABASE_URL (tests that restart the server need the local cluster).
func Cluster(t testing.TB) *localpg.Cluster {
	t.Helper()
	URL(t)
	if cluster == nil {
		t.Fatalf("testdb: this test needs the local cluster; unset %s", localpg.EnvDatabaseURL)
	}
	return cluster
}

// Config returns a pool configuration for the test database. Tests commit without
// waiting for the WAL flush: they check logic, not durability, and run faster.
func Config(t testing.TB) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL(t))
	if err != nil {
		t.Fatalf("testdb: parse url: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	cfg.MaxConns = 20
	return cfg
}

// Pool returns a pool on the migrated test database, closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), Config(t))
	if err != nil {
		t.Fatalf("testdb: open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Name returns a unique name with the given prefix, for streams, groups and queues, so
// that parallel tests share the database without seeing each other's data.
func Name(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// FreshDatabase creates an empty database (not migrated), drops it when the test ends,
// and returns its URL.
func FreshDatabase(t testing.TB) string {
	t.Helper()
	base := URL(t)
	name := strings.ReplaceAll(Name("streamd_fresh"), "-", "_")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("testdb: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("testdb: create database: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return WithDatabase(t, base, name)
}

// WithDatabase returns connection string base pointing at database name instead.
func WithDatabase(t testing.TB, base, name string) string {
	t.Helper()
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		u, err := neturl.Parse(base)
		if err != nil {
			t.Fatalf("testdb: parse url: %v", err)
		}
		u.Path = "/" + name
		return u.String()
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	return base + " dbname=" + name
}

// MustURL is URL for code without a testing.TB (TestMain, Example functions): it
// exits the test binary with the reason when no database can be had.
func MustURL() string {
	once.Do(setup)
	if initErr != nil {
		fmt.Fprintf(os.Stderr, "testdb: no test database (set %s or install the PostgreSQL server binaries): %v\n", localpg.EnvDatabaseURL, initErr)
		os.Exit(2)
	}
	return url
}

// WaitFor polls cond until it holds, failing the test after d with what it waited
// for. It is the tests' wait for a condition (never a sleep); cond runs every few
// milliseconds on the test's goroutine.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not a wait for the condition
	}
}

// WaitBlockedBy waits until the backend pid waits for a lock that the backend blocker
// holds: a signal from the server that a statement is queued behind a transaction,
// instead of a sleep. It fails the test after 5 s.
func WaitBlockedBy(t testing.TB, pool *pgxpool.Pool, pid, blocker uint32, what string) {
	t.Helper()
	WaitFor(t, 5*time.Second, what, func() bool {
		var blocked bool
		if err := pool.QueryRow(context.Background(), "SELECT $2::int = ANY (pg_blocking_pids($1))", int(pid), int(blocker)).Scan(&blocked); err != nil {
			t.Fatalf("testdb: read pg_blocking_pids: %v", err)
		}
		return blocked
	})
}

// WaitForLockWait waits until a session whose query contains queryPart waits for a
// lock that the test's own open transaction tx holds, so that a race test commits at
// the moment it means to. Naming the blocker matters: other tests run the same
// statements, and one of theirs waiting for its own reasons must not stand for the
// test's. The wait may also be through other sessions' waits: a statement queued for
// a row lock behind another waiter, or for a table behind a lock request that itself
// waits for tx, is blocked by that session first (pg_blocking_pids), and by tx only
// through it. It fails the test after 20 s.
func WaitForLockWait(t testing.TB, pool *pgxpool.Pool, tx pgx.Tx, queryPart string) {
	t.Helper()
	blocker := tx.Conn().PgConn().PID()
	WaitFor(t, 20*time.Second, fmt.Sprintf("a statement with %q waiting for a lock of the test's transaction", queryPart), func() bool {
		var n int
		if err := pool.QueryRow(context.Background(), `WITH RECURSIVE waits(pid, depth) AS (
				SELECT pid, 0 FROM pg_stat_activity
				WHERE datname = current_database() AND position($1 IN query) > 0
			UNION
				SELECT b, w.depth + 1 FROM waits w, unnest(pg_blocking_pids(w.pid)) AS b WHERE w.depth < 4)
			SELECT count(*) FROM waits WHERE depth > 0 AND pid = $2::int`, queryPart, blocker).Scan(&n); err != nil {
			t.Fatalf("testdb: read pg_stat_activity: %v", err)
		}
		return n > 0
	})
}
