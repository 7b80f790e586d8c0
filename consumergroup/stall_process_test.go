package consumergroup

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// The test binary re-executes itself as a stall-test consumer when this is set.
const stallChildEnv = "STREAMD_CG_STALL_CHILD"

// The stall test's consumer configuration; the test's bounds derive from it.
const (
	stallSession   = time.Second
	stallHeartbeat = 200 * time.Millisecond
)

// stallChildMain runs one consumer (ConsumerID from STREAMD_CG_ID) in
// CommitTransactional mode that records each event in a table in the same
// transaction as its CommitTx, until killed. It talks to the test by lines: on
// stdout "lost <partitions>" from OnLost, "open <partition>" and "commit <fenced>
// <sqlstate>" for the frozen batch; on stdin, the first line arms the freeze (the next
// batch, after its CommitTx, waits for the second line before its COMMIT: the test
// stops the process with SIGSTOP there).
func stallChildMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pcfg, err := pgxpool.ParseConfig(os.Getenv("STREAMD_CG_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The test finds this process's backends by it (its diagnostics on failure).
	pcfg.ConnConfig.RuntimeParams["application_name"] = os.Getenv("STREAMD_CG_APP")
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	armed, release := make(chan struct{}), make(chan struct{})
	go func() { // owner: the process; exits at the end of stdin
		sc := bufio.NewScanner(os.Stdin)
		if sc.Scan() {
			close(armed)
		}
		if sc.Scan() {
			close(release)
		}
	}()
	var froze atomic.Bool

	table := pgx.Identifier{os.Getenv("STREAMD_CG_TABLE")}.Sanitize()
	cfg := testConfig(os.Getenv("STREAMD_CG_STREAM"), os.Getenv("STREAMD_CG_GROUP"))
	cfg.ConsumerID = os.Getenv("STREAMD_CG_ID")
	cfg.SessionTimeout, cfg.HeartbeatInterval = stallSession, stallHeartbeat
	cfg.CommitMode = CommitTransactional
	cfg.MaxBatchSize = 5
	cfg.OnLost = func(_ context.Context, _ Membership, ps []int32) { say("lost %v", ps) }
	c, err := New(pool, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	err = c.Run(ctx, func(ctx context.Context, b *Batch) error {
		freeze := false
		select {
		case <-armed:
			freeze = froze.CompareAndSwap(false, true)
		default:
		}
		txCtx := ctx
		if freeze {
			// A stopped process does not see its context end either: the COMMIT is
			// sent when it wakes, whatever happened meanwhile.
			txCtx = context.WithoutCancel(ctx)
		}
		err := pgx.BeginFunc(txCtx, pool, func(tx pgx.Tx) error {
			for _, e := range b.Events {
				if _, err := tx.Exec(txCtx, "INSERT INTO "+table+` (partition, "offset", member) VALUES ($1, $2, $3)`,
					e.Partition, e.Offset, b.MemberID); err != nil {
					return err
				}
			}
			if err := b.CommitTx(txCtx, tx); err != nil {
				return err
			}
			if freeze {
				say("open %d", b.Partition)
				<-release
			}
			return nil
		})
		if freeze {
			say("commit %t %s", errors.Is(fencedAtCommit(err), ErrFenced), sqlerr.Code(err))
		}
		return err
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// stallChild is a consumer process of the stall test.
type stallChild struct {
	*testdb.Child

	mu    sync.Mutex
	lines []string
}

// line returns the first line the child printed that starts with prefix.
func (c *stallChild) line(prefix string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lines {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}

// TestSIGSTOPInCommitTxCostsOnlyItsPartition (issue 16, G1, G3, G4): three consumer
// processes share a 3-partition stream in CommitTransactional mode, recording each
// event in the transaction of its CommitTx, while a producer appends to every
// partition. One is stopped (SIGSTOP) inside its CommitTx transaction, after the
// commit and before COMMIT, for four session timeouts. The group expires it without
// waiting for its transaction: the two healthy members never lose their partitions,
// never rejoin, and their partitions never stop progressing for two session timeouts
// (before the fix the expiring heartbeat waited for the frozen transaction holding the
// group row; every heartbeat queued, and the healthy members were expelled). The
// frozen partition stays the frozen member's while its transaction is open (G1). When
// woken (SIGCONT), the frozen member's COMMIT is refused with ErrFenced's SQLSTATE and
// it reports the partition lost; the partition moves on. In the end every event was
// recorded exactly once and no committed offset went backwards.
func TestSIGSTOPInCommitTxCostsOnlyItsPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	const partitions = 3
	stream := newStream(t, pool, partitions)
	group := testdb.Name("g")
	table := strings.ReplaceAll(testdb.Name("cg_stall"), "-", "_")
	_, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{table}.Sanitize()+` (partition int, "offset" bigint,
		member text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (partition, "offset"))`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+pgx.Identifier{table}.Sanitize()) })

	app := testdb.Name("stall") + "-"
	spawn := func(id string) *stallChild {
		ch := &stallChild{}
		t.Cleanup(func() { // runs after StartChild's cleanup (LIFO): the child is gone
			if t.Failed() {
				ch.mu.Lock()
				t.Logf("child %s stdout:\n%s", id, strings.Join(ch.lines, "\n"))
				ch.mu.Unlock()
			}
		})
		ch.Child = testdb.StartChild(t, testdb.ChildOpts{
			Env: []string{stallChildEnv + "=1", "STREAMD_CG_URL=" + testdb.URL(t), "STREAMD_CG_TABLE=" + table,
				"STREAMD_CG_STREAM=" + stream, "STREAMD_CG_GROUP=" + group, "STREAMD_CG_ID=" + id, "STREAMD_CG_APP=" + app + id},
			Stdin: true,
			Line: func(l string) {
				ch.mu.Lock()
				ch.lines = append(ch.lines, l)
				ch.mu.Unlock()
			}})
		return ch
	}
	// owners returns each partition's owner and whether any move is pending.
	owners := func() (map[int32]string, bool) {
		rows, err := pool.Query(ctx, `SELECT partition, coalesce(owner_id, ''), target_id IS NOT NULL
			FROM streamd.consumer_partitions WHERE stream_name = $1 AND group_id = $2`, stream, group)
		require.NoError(t, err)
		out, pending := map[int32]string{}, false
		for rows.Next() {
			var p int32
			var owner string
			var moving bool
			require.NoError(t, rows.Scan(&p, &owner, &moving))
			out[p], pending = owner, pending || moving
		}
		require.NoError(t, rows.Err())
		return out, pending
	}
	dbNow := func() time.Time {
		var now time.Time
		require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now))
		return now
	}

	// The producer appends to every partition until stopped.
	var produced atomic.Int64
	stopProducer := make(chan struct{})
	producerDone := make(chan struct{})
	go func() { // owner: the test; exits when stopProducer closes
		defer close(producerDone)
		client := streams.NewClient(pool, nil)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopProducer:
				return
			case <-tick.C:
			}
			recs := make([]streams.Record, partitions)
			for p := range recs {
				part := int32(p)
				recs[p] = streams.Record{Stream: stream, Partition: &part, Data: json.RawMessage(fmt.Sprint(i))}
			}
			if _, err := client.Produce(ctx, recs...); err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			produced.Add(partitions)
		}
	}()
	t.Cleanup(func() {
		select {
		case <-stopProducer:
		default:
			close(stopProducer)
		}
		<-producerDone
	})

	// Committed offsets are sampled throughout: none may go backwards.
	var backwards atomic.Value // string: the first regression seen
	stopSampler := make(chan struct{})
	samplerDone := make(chan struct{})
	go func() { // owner: the test; exits when stopSampler closes
		defer close(samplerDone)
		last := map[int32]int64{}
		for {
			select {
			case <-stopSampler:
				return
			case <-time.After(10 * time.Millisecond):
			}
			rows, err := pool.Query(ctx, `SELECT partition, "offset" FROM streamd.consumer_offsets
				WHERE stream_name = $1 AND group_id = $2`, stream, group)
			if err != nil {
				continue
			}
			for rows.Next() {
				var p int32
				var off int64
				if rows.Scan(&p, &off) == nil {
					if prev, ok := last[p]; ok && off < prev && backwards.Load() == nil {
						backwards.Store(fmt.Sprintf("partition %d: %d after %d", p, off, prev))
					}
					last[p] = off
				}
			}
			rows.Close()
		}
	}()
	defer func() { close(stopSampler); <-samplerDone }()

	a := spawn("a")
	waitFor(t, 20*time.Second, "a owns every partition", func() bool {
		o, _ := owners()
		return len(o) == partitions && strings.HasPrefix(o[0], "a-") && o[0] == o[1] && o[1] == o[2]
	})
	b, c := spawn("b"), spawn("c")
	var before map[int32]string
	waitFor(t, 20*time.Second, "one partition each", func() bool {
		o, pending := owners()
		seen := map[string]bool{}
		for _, m := range o {
			if m != "" {
				seen[m[:1]] = true
			}
		}
		before = o
		return !pending && len(o) == partitions && len(seen) == 3
	})

	// Freeze a inside its CommitTx transaction.
	_, err = io.WriteString(a.Stdin, "arm\n")
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "a's CommitTx transaction open", func() bool { _, ok := a.line("open "); return ok })
	testdb.StopProcess(t, a.Cmd.Process.Pid)
	stoppedAt := dbNow()
	_, err = io.WriteString(a.Stdin, "go\n") // read when a wakes
	require.NoError(t, err)
	openLine, _ := a.line("open ")
	var frozen int32
	_, err = fmt.Sscanf(openLine, "open %d", &frozen)
	require.NoError(t, err)
	frozenOwner := before[frozen]
	require.True(t, strings.HasPrefix(frozenOwner, "a-"), "a owned the frozen partition: %v", before)
	healthy := map[int32]string{}
	for p, m := range before {
		if p != frozen {
			healthy[p] = m
		}
	}

	// Four session timeouts: a is expired, and its partition stays its own (G1).
	expired := false
	waitFor(t, 4*stallSession+10*time.Second, "four session timeouts", func() bool {
		o, _ := owners()
		if o[frozen] != frozenOwner {
			t.Log(stallDiagnostics(t, pool, app+"a", stream, group))
		}
		require.Equal(t, frozenOwner, o[frozen], "the frozen partition moved while its commit was in flight")
		if !expired {
			expired = !registered(t, pool, stream, group, frozenOwner)
		}
		return dbNow().Sub(stoppedAt) >= 4*stallSession
	})
	require.True(t, expired, "the frozen member was expired")
	continuedAt := dbNow()
	for p, m := range healthy {
		require.True(t, registered(t, pool, stream, group, m), "healthy member %s (partition %d) is still a member", m, p)
	}
	require.NoError(t, a.Cmd.Process.Signal(syscall.SIGCONT))

	// The frozen member's COMMIT is refused, typed; the partition moves on.
	waitFor(t, 10*time.Second, "a's frozen COMMIT answered", func() bool { _, ok := a.line("commit "); return ok })
	commitLine, _ := a.line("commit ")
	require.Equal(t, "commit true "+sqlerr.FencedSession, commitLine, "a's COMMIT was refused with ErrFenced")
	waitFor(t, 10*time.Second, "a reports the partition lost", func() bool {
		l, ok := a.line("lost ")
		return ok && l == fmt.Sprintf("lost [%d]", frozen)
	})
	waitFor(t, 10*time.Second, "the frozen partition moved", func() bool {
		o, _ := owners()
		return o[frozen] != frozenOwner
	})

	close(stopProducer)
	<-producerDone
	waitFor(t, 30*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })

	// The healthy members never lost a partition nor rejoined.
	for _, ch := range []*stallChild{b, c} {
		l, lost := ch.line("lost ")
		require.False(t, lost, "a healthy member lost partitions: %s", l)
	}
	for p, m := range healthy {
		require.True(t, registered(t, pool, stream, group, m), "healthy member %s (partition %d) never rejoined", m, p)
	}

	// Their partitions kept progressing while a was stopped. Unloaded, the longest gap
	// between two recorded batches (or the window's ends) is about a heartbeat interval
	// (FetchMaxWait plus a batch); at a load average near 50 it reached 0.97 s. The
	// bound is generous for a loaded machine, and still half of the freeze: a member
	// that waited for the frozen transaction (a heartbeat, a commit) would stall until
	// it ended, four session timeouts.
	const maxGapAllowed = 2 * stallSession
	for p := range healthy {
		rows, err := pool.Query(ctx, "SELECT at FROM "+pgx.Identifier{table}.Sanitize()+
			` WHERE partition = $1 AND at BETWEEN $2 AND $3 ORDER BY "offset"`, p, stoppedAt, continuedAt)
		require.NoError(t, err)
		prev, maxGap, n := stoppedAt, time.Duration(0), 0
		for rows.Next() {
			var at time.Time
			require.NoError(t, rows.Scan(&at))
			maxGap, prev, n = max(maxGap, at.Sub(prev)), at, n+1
		}
		require.NoError(t, rows.Err())
		maxGap = max(maxGap, continuedAt.Sub(prev))
		t.Logf("partition %d (healthy): %d events while a was stopped, longest gap %v", p, n, maxGap)
		require.Less(t, maxGap, maxGapAllowed, "partition %d stopped progressing while a was stopped", p)
	}

	// Exactly once: every produced event recorded once; the offsets agree with it.
	var n, distinct int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (partition, "offset")) FROM `+
		pgx.Identifier{table}.Sanitize()).Scan(&n, &distinct))
	require.Equal(t, produced.Load(), n, "every event recorded exactly once")
	require.Equal(t, n, distinct)
	var mismatched int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.consumer_offsets co
		WHERE co.stream_name = $1 AND co.group_id = $2
		  AND co."offset" <> (SELECT coalesce(max(x."offset") + 1, 0) FROM `+pgx.Identifier{table}.Sanitize()+` x
		                       WHERE x.partition = co.partition)`, stream, group).Scan(&mismatched))
	require.Zero(t, mismatched)
	require.Nil(t, backwards.Load(), "a committed offset went backwards")
}

// stallDiagnostics describes, for a failed G1 check, the frozen child's backends
// (is its CommitTx transaction still open?), the group's ownership rows and
// registrations, and the row locks on the ownership rows.
func stallDiagnostics(t *testing.T, pool *pgxpool.Pool, app, stream, group string) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	dump := func(title, query string, args ...any) {
		fmt.Fprintf(&b, "%s:\n", title)
		rows, err := pool.Query(ctx, query, args...)
		if err != nil {
			fmt.Fprintf(&b, "  %v\n", err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				fmt.Fprintf(&b, "  %v\n", err)
				return
			}
			fmt.Fprintf(&b, "  %v\n", vals)
		}
	}
	dump("frozen child's backends (pid, state, xact_start, backend_xid, query)", `SELECT pid, state, xact_start,
		backend_xid::text, left(query, 120) FROM pg_stat_activity WHERE application_name = $1`, app)
	dump("ownership rows (partition, owner, epoch, target, xmin, xmax)", `SELECT partition, owner_id, owner_epoch,
		target_id, xmin::text, xmax::text FROM streamd.consumer_partitions WHERE stream_name = $1 AND group_id = $2
		ORDER BY partition`, stream, group)
	dump("registrations (consumer, epoch, last_heartbeat)", `SELECT consumer_id, member_epoch, last_heartbeat
		FROM streamd.consumer_registrations WHERE stream_name = $1 AND group_id = $2`, stream, group)
	dump("offsets (partition, offset, committed_by, epoch, updated_at)", `SELECT partition, "offset", committed_by,
		member_epoch, updated_at FROM streamd.consumer_offsets WHERE stream_name = $1 AND group_id = $2`, stream, group)
	return b.String()
}
