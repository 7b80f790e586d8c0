package kafka

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/testdb"
)

// testServer is a Server on 127.0.0.1:0 over the test database.
type testServer struct {
	srv  *Server
	addr string
	stop func() // stops it and waits; safe to call twice
}

// startServer starts a Server on a listener of its own (unless cfg names one), so
// that parallel tests do not see each other's brokers. It stops when the test ends.
func startServer(t testing.TB, pool *pgxpool.Pool, cfg *Config) *testServer {
	t.Helper()
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Listener == "" {
		c.Listener = testdb.Name("test")
	}
	srv, err := New(pool, &c)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	stopped := false
	ts := &testServer{srv: srv, addr: ln.Addr().String()}
	ts.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("kafka server did not stop within 30s")
		}
	}
	t.Cleanup(ts.stop)
	// Serve registers the broker before it accepts; wait for the registration so a
	// test's first Metadata sees it.
	require.Eventually(t, func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.reg != nil
	}, 10*time.Second, 5*time.Millisecond)
	return ts
}

// newClient is a franz-go client seeded with addrs, closed when the test ends.
func newClient(t testing.TB, addrs []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func newAdmin(t testing.TB, addrs ...string) *kadm.Client {
	return kadm.NewClient(newClient(t, addrs))
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
