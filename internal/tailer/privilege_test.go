package tailer_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/tailer"
	"github.com/streamd/streamd/internal/tailer/tailertest"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/internal/testmetrics"
)

// withUser returns connection string base for role user.
func withUser(t *testing.T, base, user string) string {
	t.Helper()
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		u, err := url.Parse(base)
		require.NoError(t, err)
		u.User = url.User(user)
		return u.String()
	}
	return base + " user=" + user // a later keyword overrides an earlier one
}

// TestNoPrivilegeFallsBackGracefully: a role that may not replicate gets a tailer
// that says why (state, metric) instead of failing; a role that may not create the
// publication gets false from streamd.wakeup_publication_ensure, not an error; and a
// tailer whose role may creates the missing publication itself and streams.
func TestNoPrivilegeFallsBackGracefully(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dbURL := tailertest.Cluster(t, nil) // its own: it drops the publication
	admin, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close()

	role := strings.ReplaceAll(testdb.Name("streamd_norepl"), "-", "_")
	_, err = admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN NOREPLICATION NOSUPERUSER")
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "GRANT USAGE ON SCHEMA streamd TO "+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, dbURL)
		if err == nil {
			_, _ = c.Exec(ctx, "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
			_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize())
			_ = c.Close(ctx)
		}
	})

	// No replication privilege: the tailer cannot run, and says so.
	reg := prometheus.NewRegistry()
	tl, err := tailer.New(&tailer.Config{
		ConnString:       withUser(t, dbURL, role),
		Handler:          func(context.Context, tailer.Event) {},
		Registerer:       reg,
		UnsupportedRetry: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	tctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- tl.Run(tctx) }() // owner: this test; exits at cancel below
	testdb.WaitFor(t, 20*time.Second, "state unsupported", func() bool { return tl.State() == tailer.StateUnsupported })
	require.Equal(t, 1.0, testmetrics.Value(t, reg, "streamd_tailer_fallback_polling", "reason", tailer.ReasonPrivilege))
	require.Equal(t, 0.0, testmetrics.Value(t, reg, "streamd_tailer_fallback_polling", "reason", tailer.ReasonWalLevel))
	require.Equal(t, 0.0, testmetrics.Value(t, reg, "streamd_tailer_connected"))
	cancel()
	require.NoError(t, <-done)
	// A stopped tailer (its instance no longer leads) reports no fallback: the last
	// value used to stay, skewing sums over instances forever.
	require.Equal(t, 0.0, testmetrics.Value(t, reg, "streamd_tailer_fallback_polling", "reason", tailer.ReasonPrivilege))

	// No privilege to create the publication: false, not an error.
	_, err = admin.Exec(ctx, "DROP PUBLICATION streamd_wakeups")
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, withUser(t, dbURL, role))
	require.NoError(t, err)
	var created bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT streamd.wakeup_publication_ensure()").Scan(&created))
	require.NoError(t, conn.Close(ctx))
	require.False(t, created)

	// A role that may: the tailer creates the publication on start, then streams.
	rec := newRecorder()
	startTailer(t, dbURL, rec, nil)
	var exists bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'streamd_wakeups')").Scan(&exists))
	require.True(t, exists)
}

// TestPublicationLockTimeoutIsRetriedSoon: when creating the publication fails for a
// passing reason (here a lock_timeout behind a transaction that locks streamd.events),
// the tailer tries again with its reconnect backoff and streams once the lock is gone.
// It used to report "publication unsupported" and wait UnsupportedRetry (a minute).
func TestPublicationLockTimeoutIsRetriedSoon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dbURL := tailertest.Cluster(t, nil) // its own: it drops the publication
	admin, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close()
	_, err = admin.Exec(ctx, "DROP PUBLICATION IF EXISTS streamd_wakeups")
	require.NoError(t, err)

	blocker, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, "LOCK TABLE streamd.events IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	tl, err := tailer.New(&tailer.Config{
		ConnString:       dbURL + " options='-c lock_timeout=100ms'",
		Handler:          func(context.Context, tailer.Event) {},
		MinBackoff:       20 * time.Millisecond,
		MaxBackoff:       200 * time.Millisecond,
		UnsupportedRetry: time.Hour,
	})
	require.NoError(t, err)
	tctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- tl.Run(tctx) }() // owner: this test; exits at cancel below
	defer func() { cancel(); require.NoError(t, <-done) }()

	time.Sleep(500 * time.Millisecond) // a few tries time out behind the lock
	require.NotEqual(t, tailer.StateUnsupported, tl.State(), "a lock timeout taken for 'unsupported'")
	require.NoError(t, blocker.Rollback(ctx))
	testdb.WaitFor(t, 10*time.Second, "the tailer streaming once the lock is gone", func() bool { return tl.State() == tailer.StateStreaming })
}
