package coordinator_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/cmd/streamd/internal/coordinator"
	"github.com/streamd/streamd/internal/testdb"
)

type instance struct {
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan struct{}
	el     *coordinator.Elector
}

// start runs an elector on its own pool with lead as its term function. Its attempts
// time out after the renew interval: 300 ms and a 2 s lease, because make test at
// load 18 kept a 100 ms attempt from ever taking a 600 ms lease.
func start(t *testing.T, lease string, lead func(context.Context, coordinator.Leadership)) *instance {
	t.Helper()
	return startWith(t, lease, 2*time.Second, 300*time.Millisecond, lead)
}

func startWith(t *testing.T, lease string, ttl, renew time.Duration, lead func(context.Context, coordinator.Leadership)) *instance {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), testdb.Config(t))
	require.NoError(t, err)
	el, err := coordinator.NewElector(pool, &coordinator.ElectorConfig{
		LeaseName: lease, LeaseTTL: ttl, RenewInterval: renew})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{pool: pool, cancel: cancel, done: make(chan struct{}), el: el}
	go func() {
		defer close(in.done)
		_ = el.Run(ctx, lead)
	}()
	t.Cleanup(func() { in.stop(); pool.Close() })
	return in
}

func (in *instance) stop() {
	in.cancel()
	<-in.done
}

// crash stops the instance without releasing its lease: its connections die, as when
// the process is killed.
func (in *instance) crash() {
	in.pool.Close()
	in.stop()
}

// TestOneLeaderAtATime: three instances; at every moment at most one runs its term
// function; a clean stop hands over at once, a crash after the lease expires.
func TestOneLeaderAtATime(t *testing.T) {
	t.Parallel()
	lease := testdb.Name("lease")
	var (
		leading  atomic.Int32
		overlaps atomic.Int32
		mu       sync.Mutex
		epochs   []int64
	)
	lead := func(ctx context.Context, l coordinator.Leadership) {
		if leading.Add(1) > 1 {
			overlaps.Add(1)
		}
		mu.Lock()
		epochs = append(epochs, l.Epoch)
		mu.Unlock()
		<-ctx.Done()
		leading.Add(-1)
	}
	ins := []*instance{start(t, lease, lead), start(t, lease, lead), start(t, lease, lead)}
	leader := func() *instance {
		for _, in := range ins {
			if in.el.Current() != nil {
				return in
			}
		}
		return nil
	}
	require.Eventually(t, func() bool { return leader() != nil }, 20*time.Second, 10*time.Millisecond)

	// Clean stop: the lease is released and another instance leads well before the TTL.
	first := leader()
	firstHolder := first.el.Holder()
	first.stop()
	// A clean stop releases the lease (it expires now, not a TTL later), so a
	// successor can take it at its next attempt.
	var holder string
	var released bool
	require.NoError(t, testdb.Pool(t).QueryRow(context.Background(),
		"SELECT holder, expires_at <= clock_timestamp() FROM streamd.leader_leases WHERE name = $1", lease).Scan(&holder, &released))
	require.True(t, holder != firstHolder || released, "the stopped leader released its lease")
	require.Eventually(t, func() bool { l := leader(); return l != nil && l != first }, 20*time.Second, 5*time.Millisecond)

	// Crash: no release; the last instance takes over after the lease expires.
	second := leader()
	crashed := time.Now()
	second.crash()
	require.Eventually(t, func() bool { l := leader(); return l != nil && l != first && l != second }, 20*time.Second, 5*time.Millisecond)
	t.Logf("takeover after crash: %v", time.Since(crashed))

	require.Zero(t, overlaps.Load(), "two instances led at the same time")
	// Current() is set just before the term function starts.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(epochs) == 3 }, 20*time.Second, 5*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Less(t, epochs[0], epochs[1])
	require.Less(t, epochs[1], epochs[2])
}

// TestJobSlotsFinishOnceAcrossLeaders: a job with 150 ms slots runs on two instances
// whose leader is stopped halfway; every slot that finished ran its job exactly once.
func TestJobSlotsFinishOnceAcrossLeaders(t *testing.T) {
	t.Parallel()
	lease := testdb.Name("lease")
	jobName := testdb.Name("job")
	var calls atomic.Int64
	newLead := func(pool *pgxpool.Pool) func(context.Context, coordinator.Leadership) {
		jobs, err := coordinator.NewJobs(pool, &coordinator.JobsConfig{Jobs: []coordinator.Job{{
			Name: jobName, Interval: 150 * time.Millisecond,
			Run: func(ctx context.Context) error { calls.Add(1); return nil },
		}}})
		require.NoError(t, err)
		return jobs.Lead
	}
	// Each instance needs its jobs bound to its own pool.
	p1, err := pgxpool.NewWithConfig(context.Background(), testdb.Config(t))
	require.NoError(t, err)
	defer p1.Close()
	p2, err := pgxpool.NewWithConfig(context.Background(), testdb.Config(t))
	require.NoError(t, err)
	defer p2.Close()
	// A lease that a loaded machine (or -race) cannot lose between two renewals, so
	// the only change of leader is the stop below; a clean stop hands over at once
	// whatever the TTL.
	a := startWith(t, lease, 3*time.Second, 300*time.Millisecond, newLead(p1))
	b := startWith(t, lease, 3*time.Second, 300*time.Millisecond, newLead(p2))

	pool := testdb.Pool(t)
	finished := func() int64 {
		var n int64
		require.NoError(t, pool.QueryRow(context.Background(),
			"SELECT count(*) FROM streamd.coordinator_runs WHERE job = $1 AND finished_at IS NOT NULL", jobName).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return finished() >= 4 }, 30*time.Second, 20*time.Millisecond)
	leaderIn, successor := a, b
	if a.el.Current() == nil {
		leaderIn, successor = b, a
	}
	stopped := time.Now()
	leaderIn.stop()
	require.Eventually(t, func() bool { return successor.el.Current() != nil }, 30*time.Second, time.Millisecond)
	takeover := time.Since(stopped)
	before := finished()
	require.Eventually(t, func() bool { return finished() >= before+4 }, 30*time.Second, 20*time.Millisecond)
	a.stop()
	b.stop()

	var slots, distinctHolders int64
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*), count(DISTINCT holder) FROM streamd.coordinator_runs WHERE job = $1 AND finished_at IS NOT NULL", jobName).
		Scan(&slots, &distinctHolders))
	require.Equal(t, slots, calls.Load(), "each finished slot ran its job exactly once")
	require.Equal(t, int64(2), distinctHolders, "both instances led in turn")
	// The successor's schedule resumes with its term: the slots lost are those of the
	// takeover itself (measured above, slow under -race or load) plus a few, never a
	// schedule that restarts later or waits out slots it could run.
	allowed := int64(takeover/(150*time.Millisecond)) + 4
	var widest int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT coalesce(max(d), 0) FROM (
		SELECT slot - lag(slot) OVER (ORDER BY slot) AS d FROM streamd.coordinator_runs WHERE job = $1) s`, jobName).Scan(&widest))
	t.Logf("takeover %v, widest gap %d slots, allowed %d", takeover, widest, allowed)
	require.LessOrEqual(t, widest, allowed, "the successor kept the schedule going")
}

// TestDeposedLeaderCannotStartOrFinish: the SQL fences a stale epoch.
func TestDeposedLeaderCannotStartOrFinish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	lease := testdb.Name("lease")
	job := testdb.Name("job")
	var e1, e2 int64
	// a's TTL is long enough that b's attempt right after cannot find it expired on a
	// loaded machine (50 ms was not, under make test-race), short enough to wait out.
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.acquire_lease($1, 'a', 1000)", lease).Scan(&e1))
	var none *int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.acquire_lease($1, 'b', 50)", lease).Scan(&none))
	require.Nil(t, none, "b cannot take an unexpired lease")
	var started bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.start_coordinator_run($1, 1, $2, 'a', $3)", job, lease, e1).Scan(&started))
	require.True(t, started)
	// a's lease expires; b takes over with a higher epoch.
	require.Eventually(t, func() bool {
		var e *int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.acquire_lease($1, 'b', 5000)", lease).Scan(&e))
		if e != nil {
			e2 = *e
		}
		return e != nil
	}, 5*time.Second, 10*time.Millisecond)
	require.Greater(t, e2, e1)
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.start_coordinator_run($1, 2, $2, 'a', $3)", job, lease, e1).Scan(&started))
	require.False(t, started, "a deposed leader cannot start a run")
	// b takes over slot 1, which a started and never finished.
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.start_coordinator_run($1, 1, $2, 'b', $3)", job, lease, e2).Scan(&started))
	require.True(t, started)
	var finished bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.finish_coordinator_run($1, 1, $2, NULL)", job, e1).Scan(&finished))
	require.False(t, finished, "a deposed leader cannot finish a run")
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.finish_coordinator_run($1, 1, $2, NULL)", job, e2).Scan(&finished))
	require.True(t, finished)
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.start_coordinator_run($1, 1, $2, 'b', $3)", job, lease, e2).Scan(&started))
	require.False(t, started, "a finished slot does not run again")
}

// TestFinishedRunsAreForgotten: a job's runs more than 1000 slots old are deleted as
// later ones finish; coordinator_runs grew by a row per slot forever.
func TestFinishedRunsAreForgotten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	job := testdb.Name("prune-job")
	_, err := pool.Exec(ctx, `INSERT INTO streamd.coordinator_runs (job, slot, holder, epoch, finished_at)
		SELECT $1, s, 'h', 7, CASE WHEN s < 1100 THEN now() END FROM generate_series(0, 1100) s`, job)
	require.NoError(t, err)
	var ok bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.finish_coordinator_run($1, 1100, 7, NULL)", job).Scan(&ok))
	require.True(t, ok)
	var n, lo int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), min(slot) FROM streamd.coordinator_runs WHERE job = $1", job).Scan(&n, &lo))
	require.Equal(t, int64(1001), n)
	require.Equal(t, int64(100), lo)
	_, err = pool.Exec(ctx, "DELETE FROM streamd.coordinator_runs WHERE job = $1", job)
	require.NoError(t, err)
}

// TestSlotStartFailureIsRetriedInTheSlot: when the leader cannot record a slot's start
// (here its statement times out behind another transaction's uncommitted row for the
// slot), it tries again within the slot and runs the job; it used to skip the slot
// (with a one-hour interval, the job would not have run for an hour).
func TestSlotStartFailureIsRetriedInTheSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lease, jobName := testdb.Name("lease"), testdb.Name("retry-job")
	const interval = time.Hour
	slot := time.Now().UnixNano() / int64(interval)
	if time.Until(time.Unix(0, (slot+1)*int64(interval))) < time.Minute {
		t.Skip("too close to the end of the slot")
	}
	// Block the slot's row: the leader's insert waits on it, past its statement_timeout.
	blocker, err := testdb.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, `INSERT INTO streamd.coordinator_runs (job, slot, holder, epoch) VALUES ($1, $2, 'blocker', 0)`, jobName, slot)
	require.NoError(t, err)

	cfg := testdb.Config(t)
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "200ms"
	jobsPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer jobsPool.Close()
	var calls atomic.Int64
	logs := testdb.NewLogs()
	jobs, err := coordinator.NewJobs(jobsPool, &coordinator.JobsConfig{Logger: logs.Logger(), Jobs: []coordinator.Job{{
		Name: jobName, Interval: interval, Run: func(context.Context) error { calls.Add(1); return nil },
	}}})
	require.NoError(t, err)
	start(t, lease, jobs.Lead)

	// The leader's first try times out, and so does the next: a retry is observed.
	logs.WaitFor(t, "start coordinator run failed; trying again", 2)
	require.Zero(t, calls.Load())
	require.NoError(t, blocker.Rollback(ctx))
	require.Eventually(t, func() bool { return calls.Load() == 1 }, 20*time.Second, 20*time.Millisecond,
		"the slot was tried again and run")
}

// TestOwnCommittedStartIsRunAgain: a slot's start that committed but whose answer was
// lost is tried again by the same leader (same epoch), which then runs the slot. It
// used to read the row as "finished already" and skip the slot.
func TestOwnCommittedStartIsRunAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	lease, holder, jobName := testdb.Name("lease"), testdb.Name("holder"), testdb.Name("job")
	const interval = time.Hour
	slot := time.Now().UnixNano() / int64(interval)
	if time.Until(time.Unix(0, (slot+1)*int64(interval))) < time.Minute {
		t.Skip("too close to the end of the slot")
	}
	var epoch int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.acquire_lease($1, $2, 600000)", lease, holder).Scan(&epoch))
	var started bool // the first attempt: committed, its answer lost on the way back
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.start_coordinator_run($1, $2, $3, $4, $5)",
		jobName, slot, lease, holder, epoch).Scan(&started))
	require.True(t, started)

	var calls atomic.Int64
	jobs, err := coordinator.NewJobs(pool, &coordinator.JobsConfig{Jobs: []coordinator.Job{{
		Name: jobName, Interval: interval, Run: func(context.Context) error { calls.Add(1); return nil },
	}}})
	require.NoError(t, err)
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		jobs.Lead(lctx, coordinator.Leadership{Lease: lease, Holder: holder, Epoch: epoch})
	}()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool {
		var finished bool
		err := pool.QueryRow(ctx, "SELECT finished_at IS NOT NULL FROM streamd.coordinator_runs WHERE job = $1 AND slot = $2",
			jobName, slot).Scan(&finished)
		return err == nil && finished
	}, 10*time.Second, 20*time.Millisecond, "the slot ran and finished")
	require.EqualValues(t, 1, calls.Load())
}

// TestLeaseTTLPastInt32MillisecondsRefused: the lease functions take milliseconds as
// an integer; a longer TTL wrapped around to a negative one, every lease was born
// expired and every instance led at once. NewElector refuses it.
func TestLeaseTTLPastInt32MillisecondsRefused(t *testing.T) {
	t.Parallel()
	_, err := coordinator.NewElector(testdb.Pool(t), &coordinator.ElectorConfig{LeaseName: testdb.Name("lease"), LeaseTTL: 600 * time.Hour})
	require.ErrorContains(t, err, "LeaseTTL")
}
