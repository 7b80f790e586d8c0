package consumergroup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// quietLogger keeps test output readable; set STREAMD_TEST_LOG=1 to see the logs.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func testConfig(stream, group string) *Config {
	return &Config{
		Stream: stream, Group: group, SessionTimeout: 1500 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond,
		FetchMaxWait: 100 * time.Millisecond, RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond,
		Logger: quietLogger(), MaxBatchSize: 20,
	}
}

// produce appends n events spread over the stream's partitions by key, in one
// transaction, and returns their positions.
func produce(t *testing.T, pool *pgxpool.Pool, stream string, from, n int) []streams.Position {
	t.Helper()
	recs := make([]streams.Record, n)
	for i := range recs {
		recs[i] = streams.Record{Stream: stream, Key: fmt.Sprint("k", from+i), Data: json.RawMessage(fmt.Sprint(from + i))}
	}
	pos, err := streams.NewClient(pool, nil).Produce(context.Background(), recs...)
	require.NoError(t, err)
	return pos
}

// waitFor is testdb.WaitFor.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testdb.WaitFor(t, d, what, cond)
}

// groupLag is the group's total lag from the consumer_group_status view.
func groupLag(t *testing.T, pool *pgxpool.Pool, stream, group string) int64 {
	t.Helper()
	var lag int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT coalesce(sum(lag), -1) FROM streamd.consumer_group_status
		WHERE stream_name = $1 AND group_id = $2`, stream, group).Scan(&lag))
	return lag
}

type handled struct {
	mu   sync.Mutex
	seen map[[2]int64]int
}

func (h *handled) add(p int32, off int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen == nil {
		h.seen = map[[2]int64]int{}
	}
	h.seen[[2]int64{int64(p), off}]++
}

func (h *handled) requireAll(t *testing.T, pos []streams.Position) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range pos {
		require.NotZero(t, h.seen[[2]int64{int64(p.Partition), p.Offset}], "event %d/%d never handled", p.Partition, p.Offset)
	}
}

func runConsumer(t *testing.T, c *Consumer, h Handler) (cancel func() error) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx, h) }()
	var once sync.Once
	var err error
	cancel = func() error {
		once.Do(func() {
			stop()
			select {
			case err = <-errc:
			case <-time.After(15 * time.Second):
				err = errors.New("Run did not return within 15s of cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = cancel() })
	return cancel
}

// TestConsumerConsumesCommitsAndLeaves: one consumer handles every event once in
// order per partition, commits up to the log end (lag 0), and on cancel returns nil
// after leaving the group (its registration is gone).
func TestConsumerConsumesCommitsAndLeaves(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 4)
	group := testdb.Name("g")
	pos := produce(t, pool, stream, 0, 200)
	var h handled
	var orderErr atomic.Value
	last := map[int32]int64{}
	var mu sync.Mutex
	var assigned atomic.Int32
	cfg := testConfig(stream, group)
	cfg.OnAssigned = func(ctx context.Context, _ Membership, ps []int32) { assigned.Add(int32(len(ps))) }
	c, err := New(pool, cfg)
	require.NoError(t, err)
	stop := runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range b.Events {
			if prev, ok := last[e.Partition]; ok && e.Offset != prev+1 {
				orderErr.Store(fmt.Sprintf("partition %d: offset %d after %d", e.Partition, e.Offset, prev))
			}
			last[e.Partition] = e.Offset
			h.add(e.Partition, e.Offset)
		}
		return nil
	})
	waitFor(t, 10*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })
	require.Nil(t, orderErr.Load())
	h.requireAll(t, pos)
	require.EqualValues(t, 4, assigned.Load())
	require.Equal(t, []int32{0, 1, 2, 3}, c.Assignment())
	require.NoError(t, stop())
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM streamd.consumer_registrations
		WHERE stream_name = $1 AND group_id = $2`, stream, group).Scan(&n))
	require.Zero(t, n, "a clean exit leaves the group")
}

// TestConsumerRejectsBadConfig: each bad field is named in a typed error.
func TestConsumerRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]Config{
		"Stream":            {Group: "g"},
		"Group":             {Stream: "s", Group: "bad group"},
		"HeartbeatInterval": {Stream: "s", Group: "g", SessionTimeout: time.Second, HeartbeatInterval: 2 * time.Second},
		"CommitMode":        {Stream: "s", Group: "g", CommitMode: 9},
		"RetryBackoffMax":   {Stream: "s", Group: "g", RetryBackoff: time.Second, RetryBackoffMax: time.Millisecond},
	} {
		_, err := New(nil, &cfg)
		require.ErrorIs(t, err, ErrInvalidArgument, field)
		require.Contains(t, err.Error(), "Config."+field)
	}
	_, err := New(nil, nil)
	require.ErrorIs(t, err, ErrInvalidArgument, "a nil Config is an empty one")
}

// TestConsumerRejectsTimeoutsPastInt32Milliseconds: SessionTimeout and
// RebalanceTimeout travel to PostgreSQL as integer milliseconds, and RebalanceTimeout
// defaults to MaxPollInterval; longer than 2^31-1 ms (about 24.8 days) each is refused
// by New naming its field, checked after the defaults apply. They passed, and Run
// failed with an untyped encoding error. The longest allowed value works.
func TestConsumerRejectsTimeoutsPastInt32Milliseconds(t *testing.T) {
	t.Parallel()
	const tooLong = 25 * 24 * time.Hour
	for field, cfg := range map[string]Config{
		"MaxPollInterval":  {Stream: "s", Group: "g", MaxPollInterval: tooLong},
		"RebalanceTimeout": {Stream: "s", Group: "g", RebalanceTimeout: tooLong},
		"SessionTimeout":   {Stream: "s", Group: "g", SessionTimeout: tooLong},
	} {
		_, err := New(nil, &cfg)
		require.ErrorIs(t, err, ErrInvalidArgument, field)
		require.Contains(t, err.Error(), "Config."+field)
	}

	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	cfg := testConfig(stream, group)
	cfg.MaxPollInterval = math.MaxInt32 * time.Millisecond // RebalanceTimeout follows it
	c, err := New(pool, cfg)
	require.NoError(t, err)
	runConsumer(t, c, func(context.Context, *Batch) error { return nil })
	waitFor(t, 5*time.Second, "joined and assigned", func() bool { return len(c.Assignment()) == 1 })
}

// TestRebalanceHandsOverAfterCommit: a second member joins; the first finishes its
// in-flight batch, commits, calls OnRevoked, and only then does the second member
// start the partition, from the committed offset; each member ends with 2 of 4.
func TestRebalanceHandsOverAfterCommit(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 4)
	group := testdb.Name("g")
	pos := produce(t, pool, stream, 0, 100)
	var h handled
	var mu sync.Mutex
	active := map[int32]string{} // partition -> member handling it now
	var overlap atomic.Value
	handler := func(ctx context.Context, b *Batch) error {
		mu.Lock()
		if other, busy := active[b.Partition]; busy {
			overlap.Store(fmt.Sprintf("partition %d handled by %s and %s", b.Partition, other, b.MemberID))
		}
		active[b.Partition] = b.MemberID
		mu.Unlock()
		time.Sleep(5 * time.Millisecond) // simulated work
		mu.Lock()
		delete(active, b.Partition)
		mu.Unlock()
		for _, e := range b.Events {
			h.add(e.Partition, e.Offset)
		}
		return nil
	}
	var revoked atomic.Int32
	cfgA := testConfig(stream, group)
	cfgA.MaxBatchSize = 2
	cfgA.OnRevoked = func(ctx context.Context, _ Membership, ps []int32) { revoked.Add(int32(len(ps))) }
	a, err := New(pool, cfgA)
	require.NoError(t, err)
	runConsumer(t, a, handler)
	waitFor(t, 5*time.Second, "a owns 4", func() bool { return len(a.Assignment()) == 4 })
	b, err := New(pool, testConfig(stream, group))
	require.NoError(t, err)
	start := time.Now()
	runConsumer(t, b, handler)
	waitFor(t, 5*time.Second, "2 and 2", func() bool { return len(a.Assignment()) == 2 && len(b.Assignment()) == 2 })
	t.Logf("rebalance settled in %v", time.Since(start))
	require.EqualValues(t, 2, revoked.Load())
	pos = append(pos, produce(t, pool, stream, 100, 100)...)
	waitFor(t, 10*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })
	require.Nil(t, overlap.Load())
	h.requireAll(t, pos)
}

// TestFrozenMemberIsFencedAndRejoins: a member frozen (no heartbeats, handler stuck)
// past its session timeout loses its partitions to the other member; when it thaws,
// its in-flight commit is refused (ErrFenced), it reports OnLost, drops the partitions
// and joins again, ending with a balanced share; nothing is lost.
func TestFrozenMemberIsFencedAndRejoins(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 4)
	group := testdb.Name("g")
	pos := produce(t, pool, stream, 0, 40)
	var h handled
	thaw := make(chan struct{})
	var frozen atomic.Bool
	var lost atomic.Int32
	cfgA := testConfig(stream, group)
	cfgA.MaxBatchSize = 1
	cfgA.OnLost = func(ctx context.Context, _ Membership, ps []int32) { lost.Add(int32(len(ps))) }
	cfgA.hooks = &testHooks{beforeHeartbeat: func() {
		if frozen.Load() {
			<-thaw
		}
	}}
	a, err := New(pool, cfgA)
	require.NoError(t, err)
	inFrozenBatch := make(chan struct{})
	var once sync.Once
	runConsumer(t, a, func(ctx context.Context, b *Batch) error {
		if frozen.Load() {
			once.Do(func() { close(inFrozenBatch) })
			<-thaw // the whole process is stopped: the handler does not see ctx either
		}
		for _, e := range b.Events {
			h.add(e.Partition, e.Offset)
		}
		return nil
	})
	waitFor(t, 5*time.Second, "a owns 4", func() bool { return len(a.Assignment()) == 4 })
	frozen.Store(true)
	produce(t, pool, stream, 40, 1) // make sure a batch is in flight when frozen
	pos = append(pos, produce(t, pool, stream, 41, 40)...)
	<-inFrozenBatch

	var bHandled handled
	b, err := New(pool, testConfig(stream, group))
	require.NoError(t, err)
	runConsumer(t, b, func(ctx context.Context, batch *Batch) error {
		for _, e := range batch.Events {
			h.add(e.Partition, e.Offset)
			bHandled.add(e.Partition, e.Offset)
		}
		return nil
	})
	waitFor(t, 10*time.Second, "b owns all 4 after a's session expired", func() bool { return len(b.Assignment()) == 4 })
	fencedBefore := counterValue(a.metrics.fencedCommits)
	close(thaw)
	frozen.Store(false)
	waitFor(t, 10*time.Second, "a rejoined with 2", func() bool { return len(a.Assignment()) == 2 && len(b.Assignment()) == 2 })
	require.EqualValues(t, 4, lost.Load(), "a reports all 4 partitions lost")
	require.Greater(t, counterValue(a.metrics.fencedCommits), fencedBefore, "a's in-flight commit was fenced")
	waitFor(t, 10*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })
	h.requireAll(t, pos)
}

// TestCommitTxCrashLeavesNeither: in transactional mode, a handler that wrote its row
// and the offset in its transaction but failed before committing it leaves neither;
// the retry writes both, exactly once.
func TestCommitTxCrashLeavesNeither(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	table := pgx.Identifier{strings.ReplaceAll(testdb.Name("cg_proj"), "-", "_")}.Sanitize()
	_, err := pool.Exec(ctx, "CREATE TABLE "+table+` (partition int, "offset" bigint, PRIMARY KEY (partition, "offset"))`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table) })
	produce(t, pool, stream, 0, 1)

	cfg := testConfig(stream, group)
	cfg.CommitMode = CommitTransactional
	var calls atomic.Int32
	crashed := make(chan struct{})
	resume := make(chan struct{})
	c, err := New(pool, cfg)
	require.NoError(t, err)
	runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, e := range b.Events {
				if _, err := tx.Exec(ctx, "INSERT INTO "+table+` VALUES ($1, $2)`, e.Partition, e.Offset); err != nil {
					return err
				}
			}
			if err := b.CommitTx(ctx, tx); err != nil {
				return err
			}
			if calls.Add(1) == 1 {
				close(crashed)
				<-resume
				return errors.New("crash before the transaction commits")
			}
			return nil
		})
	})
	<-crashed
	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows))
	require.Zero(t, rows, "uncommitted write invisible")
	close(resume)
	waitFor(t, 10*time.Second, "offset committed", func() bool {
		off, ok, err := committedOffset(ctx, pool, stream, group, 0)
		return err == nil && ok && off == 1
	})
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows))
	require.Equal(t, 1, rows)
	require.EqualValues(t, 2, calls.Load())
}

// TestCommitTxOnceWhenTheAckIsLost: G4 with a lost acknowledgement. The handler's
// transaction, with CommitTx, commits, but the handler fails anyway (as when the
// connection drops after the server committed); the worker runs the batch again, and
// that attempt's CommitTx is refused (ErrAlreadyCommitted), so its writes roll back:
// each event's effect exists once, and the worker moves on.
func TestCommitTxOnceWhenTheAckIsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	table := pgx.Identifier{strings.ReplaceAll(testdb.Name("cg_once"), "-", "_")}.Sanitize()
	_, err := pool.Exec(ctx, "CREATE TABLE "+table+` (partition int, "offset" bigint)`) // no key: duplicates would show
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table) })
	produce(t, pool, stream, 0, 3)

	cfg := testConfig(stream, group)
	cfg.CommitMode = CommitTransactional
	var calls atomic.Int32
	var refused atomic.Bool
	c, err := New(pool, cfg)
	require.NoError(t, err)
	runConsumer(t, c, func(ctx context.Context, b *Batch) error {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, e := range b.Events {
				if _, err := tx.Exec(ctx, "INSERT INTO "+table+` VALUES ($1, $2)`, e.Partition, e.Offset); err != nil {
					return err
				}
			}
			err := b.CommitTx(ctx, tx)
			if errors.Is(err, ErrAlreadyCommitted) {
				refused.Store(true)
			}
			return err
		})
		if err == nil && calls.Add(1) == 1 {
			return errors.New("connection reset (the commit went through)")
		}
		return err
	})
	waitFor(t, 10*time.Second, "the second attempt refused", refused.Load)
	produce(t, pool, stream, 3, 2)
	waitFor(t, 10*time.Second, "the later events committed", func() bool {
		off, ok, err := committedOffset(ctx, pool, stream, group, 0)
		return err == nil && ok && off == 5
	})
	var rows, distinct int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT "offset") FROM `+table).Scan(&rows, &distinct))
	require.Equal(t, 5, distinct)
	require.Equal(t, 5, rows, "each event's effect once")
}
