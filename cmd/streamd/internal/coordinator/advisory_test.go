package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/advisory"
	"github.com/streamd/streamd/cmd/streamd/internal/coordinator"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// TestLeaderChangedAdvisory: each term an elector takes is a leader change on the
// advisory stream (holder and epoch), written by the publisher, not by the elector's
// renewals; a successor's term is another.
func TestLeaderChangedAdvisory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	var from int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT next_offset FROM streamd.stream_partitions WHERE stream_name = $1",
		advisory.Stream).Scan(&from))
	pub, err := advisory.New(pool, nil)
	require.NoError(t, err)
	pctx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan error, 1)
	go func() { pubDone <- pub.Run(pctx) }() // owner: this test
	defer func() { stopPub(); require.NoError(t, <-pubDone) }()

	lease := testdb.Name("lease")
	run := func(holder string) (*coordinator.Elector, func()) {
		p, err := pgxpool.NewWithConfig(ctx, testdb.Config(t))
		require.NoError(t, err)
		el, err := coordinator.NewElector(p, &coordinator.ElectorConfig{Advisories: pub, Holder: holder, LeaseName: lease,
			LeaseTTL: 10 * time.Second, RenewInterval: 2 * time.Second}) // a loaded machine's acquisitions take 100s of ms
		require.NoError(t, err)
		ectx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = el.Run(ectx, func(ctx context.Context, _ coordinator.Leadership) { <-ctx.Done() })
		}()
		return el, func() { cancel(); <-done; p.Close() }
	}
	changes := func() []advisory.LeaderChanged {
		var out []advisory.LeaderChanged
		for off := from; ; {
			res, err := streams.FetchTx(ctx, pool, advisory.Stream, 0, off, &streams.FetchOpts{MaxRecords: 1000})
			require.NoError(t, err)
			if len(res.Events) == 0 {
				return out
			}
			for _, e := range res.Events {
				if e.EventType == advisory.TypeLeaderChanged && e.Key == lease {
					v, err := advisory.Decode(e.EventType, e.Data)
					require.NoError(t, err)
					out = append(out, *v.(*advisory.LeaderChanged))
				}
			}
			off = res.NextOffset
		}
	}
	a, stopA := run("a")
	testdb.WaitFor(t, 60*time.Second, "a leads", func() bool { return a.Current() != nil })
	testdb.WaitFor(t, 60*time.Second, "a's term advised", func() bool { return len(changes()) == 1 })
	first := a.Current().Epoch
	b, stopB := run("b")
	defer stopB()
	stopA() // a releases the lease: b takes it
	testdb.WaitFor(t, 60*time.Second, "b leads", func() bool { return b.Current() != nil })
	testdb.WaitFor(t, 60*time.Second, "b's term advised", func() bool { return len(changes()) == 2 })
	got := changes()
	require.Equal(t, advisory.LeaderChanged{Lease: lease, Holder: "a", Epoch: first, At: got[0].At}, got[0])
	require.Equal(t, "b", got[1].Holder)
	require.Greater(t, got[1].Epoch, first)
}
