package consumergroup

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// childProc is a consumer child process (childMain).
type childProc struct {
	*testdb.Child
	name  string
	ready chan struct{} // closed when it printed childReady
}

// term stops the child with SIGTERM once it handles it (a fresh process would die of
// it before installing its handler) and waits for it to exit 0.
func (ch *childProc) term(t *testing.T) {
	t.Helper()
	select {
	case <-ch.ready:
	case <-ch.Done:
		t.Fatalf("%s exited before it was ready: %v", ch.name, ch.Err)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not ready within 30s", ch.name)
	}
	require.NoError(t, ch.Cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-ch.Done:
		require.NoError(t, ch.Err, "%s stopped with SIGTERM exits 0", ch.name)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not stop within 30s of SIGTERM", ch.name)
	}
}

// spawnChild starts a consumer child named name (its member ids start with name+"-")
// with extra environment variables.
func spawnChild(t *testing.T, name string, env ...string) *childProc {
	t.Helper()
	ch := &childProc{name: name, ready: make(chan struct{})}
	ready := false
	ch.Child = testdb.StartChild(t, testdb.ChildOpts{
		Env: append([]string{childEnv + "=1", "STREAMD_CG_URL=" + testdb.URL(t), "STREAMD_CG_ID=" + name}, env...),
		Line: func(l string) {
			if l == childReady && !ready {
				ready = true
				close(ch.ready)
			}
		}})
	return ch
}

// offsetWatch samples a group's committed offsets until stopped and reports any that
// went backwards.
func offsetWatch(t *testing.T, pool *pgxpool.Pool, stream, group string) (stop func()) {
	t.Helper()
	quit, done := make(chan struct{}), make(chan struct{})
	go func() { // owner: the test, through stop
		defer close(done)
		last := map[int32]int64{}
		for {
			select {
			case <-quit:
				return
			case <-time.After(10 * time.Millisecond): // sampling period
			}
			rows, err := pool.Query(context.Background(), `SELECT partition, "offset" FROM streamd.consumer_offsets
				WHERE stream_name = $1 AND group_id = $2`, stream, group)
			if err != nil {
				t.Errorf("watch offsets: %v", err)
				return
			}
			for rows.Next() {
				var p int32
				var off int64
				if err := rows.Scan(&p, &off); err != nil {
					t.Errorf("scan: %v", err)
				}
				if prev, ok := last[p]; ok && off < prev {
					t.Errorf("committed offset of partition %d went back from %d to %d", p, prev, off)
				}
				last[p] = off
			}
			rows.Close()
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(quit); <-done }) }
	t.Cleanup(stop)
	return stop
}

// TestSIGTERMAndKill9ChildConsumers (issue 16): consumer processes with CommitTx
// handlers are stopped with SIGTERM and killed with SIGKILL, each in the middle of a
// batch, while a producer appends. Checked:
//   - the SIGTERM'd member's in-flight batch is committed by it (with its effects),
//     not redone by the next owner; it exits 0, having left the group: its
//     partitions move at once, although its session timeout (20s) is longer than the
//     test;
//   - every event's effect is recorded exactly once and matches the committed
//     offsets; no committed offset goes back;
//   - the survivor never loses a partition (OnLost), and neither does the stopped
//     member (a drain is a revoke).
//
// Handlers used to see their ctx cancelled at SIGTERM ("commit batch … context
// canceled"): the in-flight batch rolled back and the next owner redid it.
func TestSIGTERMAndKill9ChildConsumers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 4)
	group := testdb.Name("g")
	ident := func(prefix string) string {
		name := strings.ReplaceAll(testdb.Name(prefix), "-", "_")
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
		})
		return name
	}
	effects, attempts, lost := ident("cg_effects"), ident("cg_attempts"), ident("cg_lost")
	for _, ddl := range []string{
		"CREATE TABLE " + pgx.Identifier{effects}.Sanitize() + ` (partition int, "offset" bigint, member text NOT NULL, PRIMARY KEY (partition, "offset"))`,
		"CREATE TABLE " + pgx.Identifier{attempts}.Sanitize() + ` (partition int NOT NULL, first bigint NOT NULL, member text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		"CREATE TABLE " + pgx.Identifier{lost}.Sanitize() + ` (member text NOT NULL, partitions int[] NOT NULL)`,
	} {
		_, err := pool.Exec(ctx, ddl)
		require.NoError(t, err)
	}
	env := []string{"STREAMD_CG_TABLE=" + effects, "STREAMD_CG_STREAM=" + stream, "STREAMD_CG_GROUP=" + group,
		"STREAMD_CG_ATTEMPTS=" + attempts, "STREAMD_CG_LOST=" + lost, "STREAMD_CG_WORK=150ms"}

	// The producer appends until told to stop.
	var produced atomic.Int64
	stopProducing, producerDone := make(chan struct{}), make(chan struct{})
	go func() { // owner: the test; ends on stopProducing
		defer close(producerDone)
		client := streams.NewClient(pool, nil)
		for i := 0; ; i++ {
			select {
			case <-stopProducing:
				return
			case <-time.After(20 * time.Millisecond): // the producer's pace
			}
			recs := make([]streams.Record, 4)
			for j := range recs {
				recs[j] = streams.Record{Stream: stream, Key: fmt.Sprint(i, "-", j), Data: []byte(`{}`)}
			}
			if _, err := client.Produce(ctx, recs...); err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			produced.Add(int64(len(recs)))
		}
	}()
	stopWatch := offsetWatch(t, pool, stream, group)

	count := func(sql string, args ...any) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n))
		return n
	}
	recorders := func() int {
		return count(`SELECT count(DISTINCT split_part(member, '-', 1)) FROM ` + pgx.Identifier{effects}.Sanitize())
	}
	// inFlight waits for a batch that the named member started and has not committed
	// (its effects are not visible), and returns it.
	inFlight := func(name string) (int32, int64) {
		var p int32
		var first int64
		waitFor(t, 20*time.Second, name+" in the middle of a batch", func() bool {
			err := pool.QueryRow(ctx, `SELECT a.partition, a.first FROM `+pgx.Identifier{attempts}.Sanitize()+` a
				WHERE a.member LIKE $1 || '-%' AND NOT EXISTS (SELECT 1 FROM `+pgx.Identifier{effects}.Sanitize()+` e
				      WHERE e.partition = a.partition AND e."offset" = a.first)
				ORDER BY a.at DESC LIMIT 1`, name).Scan(&p, &first)
			return err == nil
		})
		return p, first
	}

	// a has a session timeout longer than the test: only its leave can hand its
	// partitions over in time.
	a := spawnChild(t, "a", append(env, "STREAMD_CG_SESSION=20s")...)
	b := spawnChild(t, "b", append(env, "STREAMD_CG_SESSION=5s")...)
	c := spawnChild(t, "c", append(env, "STREAMD_CG_SESSION=10s")...)
	waitFor(t, 60*time.Second, "three members recording", func() bool { return recorders() == 3 })

	p, first := inFlight("a")
	a.term(t)
	require.Zero(t, count(`SELECT count(*) FROM streamd.consumer_registrations
		WHERE stream_name = $1 AND group_id = $2 AND consumer_id LIKE 'a-%'`, stream, group), "a left the group")
	var by string
	require.NoError(t, pool.QueryRow(ctx, `SELECT member FROM `+pgx.Identifier{effects}.Sanitize()+
		` WHERE partition = $1 AND "offset" = $2`, p, first).Scan(&by), "a's in-flight batch %d@%d was not committed", p, first)
	require.True(t, strings.HasPrefix(by, "a-"), "a's in-flight batch %d@%d was redone by %s", p, first, by)
	require.Equal(t, 1, count(`SELECT count(*) FROM `+pgx.Identifier{attempts}.Sanitize()+
		` WHERE partition = $1 AND first = $2`, p, first), "a's in-flight batch was handled again")
	waitFor(t, 5*time.Second, "a's partitions owned by b and c (not after a's 20s session)", func() bool {
		return count(`SELECT count(*) FROM streamd.consumer_partitions WHERE stream_name = $1 AND group_id = $2
			AND (owner_id LIKE 'b-%' OR owner_id LIKE 'c-%')`, stream, group) == 4
	})

	inFlight("b")
	require.NoError(t, b.Cmd.Process.Signal(syscall.SIGKILL))
	<-b.Done
	waitFor(t, 30*time.Second, "c owns every partition", func() bool {
		return count(`SELECT count(*) FROM streamd.consumer_partitions WHERE stream_name = $1 AND group_id = $2
			AND owner_id LIKE 'c-%'`, stream, group) == 4
	})
	close(stopProducing)
	<-producerDone
	waitFor(t, 30*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })
	stopWatch()

	var n, distinct int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (partition, "offset")) FROM `+
		pgx.Identifier{effects}.Sanitize()).Scan(&n, &distinct))
	require.EqualValues(t, produced.Load(), n, "every event recorded exactly once")
	require.Equal(t, n, distinct)
	require.Zero(t, count(`SELECT count(*) FROM streamd.consumer_offsets co
		WHERE co.stream_name = $1 AND co.group_id = $2
		  AND co."offset" <> (SELECT coalesce(max(x."offset") + 1, 0) FROM `+pgx.Identifier{effects}.Sanitize()+` x
		                       WHERE x.partition = co.partition)`, stream, group), "the offsets and the effects agree")
	require.Zero(t, count(`SELECT count(*) FROM `+pgx.Identifier{lost}.Sanitize()), "a partition was lost (OnLost)")
	_ = c
}

// TestChildChaos (make soak-groups): consumer processes with CommitTx handlers are
// started, stopped with SIGTERM, killed with SIGKILL and frozen with SIGSTOP (for up
// to twice their session timeout, then SIGCONT) at random while a producer appends.
// Checked: a SIGTERM'd member exits 0; every event's effect is recorded exactly once
// and matches the committed offsets; no committed offset goes back; the lag reaches
// zero. Random seed (logged), STREAMD_SOAK_DURATION (default 2m).
func TestChildChaos(t *testing.T) {
	if os.Getenv("STREAMD_SOAK") != "1" {
		t.Skip("soak: set STREAMD_SOAK=1 (make soak-groups)")
	}
	t.Parallel()
	seed, duration := uint64(time.Now().UnixNano()), 2*time.Minute
	if d, err := time.ParseDuration(os.Getenv("STREAMD_SOAK_DURATION")); err == nil {
		duration = d
	}
	t.Logf("seed %d, duration %v", seed, duration)
	rng := rand.New(rand.NewPCG(seed, seed))
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 6)
	group := testdb.Name("g")
	effects := strings.ReplaceAll(testdb.Name("cg_chaos"), "-", "_")
	_, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{effects}.Sanitize()+
		` (partition int, "offset" bigint, member text NOT NULL, PRIMARY KEY (partition, "offset"))`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+pgx.Identifier{effects}.Sanitize()) })
	const session = 2 * time.Second
	env := []string{"STREAMD_CG_TABLE=" + effects, "STREAMD_CG_STREAM=" + stream, "STREAMD_CG_GROUP=" + group,
		"STREAMD_CG_SESSION=" + session.String(), "STREAMD_CG_WORK=20ms"}

	var produced atomic.Int64
	stopProducing, producerDone := make(chan struct{}), make(chan struct{})
	prng := rand.New(rand.NewPCG(seed+1, seed+1))
	go func() { // owner: the test; ends on stopProducing
		defer close(producerDone)
		client := streams.NewClient(pool, nil)
		for i := 0; ; i++ {
			select {
			case <-stopProducing:
				return
			case <-time.After(time.Duration(5+prng.IntN(20)) * time.Millisecond): // the producer's pace
			}
			recs := make([]streams.Record, 5)
			for j := range recs {
				recs[j] = streams.Record{Stream: stream, Key: fmt.Sprint(i, "-", j), Data: []byte(`{}`)}
			}
			if _, err := client.Produce(ctx, recs...); err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			produced.Add(int64(len(recs)))
		}
	}()
	stopWatch := offsetWatch(t, pool, stream, group)

	type proc struct {
		*childProc
		frozen atomic.Bool
	}
	var live []*proc
	var thaws sync.WaitGroup
	spawned, terms, kills, freezes := 0, 0, 0, 0
	pick := func() (int, *proc) {
		i := rng.IntN(len(live))
		return i, live[i]
	}
	for deadline := time.Now().Add(duration); time.Now().Before(deadline); {
		time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond) // pacing of the chaos, not a wait
		switch op := rng.IntN(10); {
		case len(live) < 2 || (op < 3 && len(live) < 4):
			spawned++
			live = append(live, &proc{childProc: spawnChild(t, fmt.Sprint("m", spawned), env...)})
		case op < 6:
			i, p := pick()
			if p.frozen.Load() {
				continue // a stopped process would handle SIGTERM only once continued
			}
			p.term(t)
			live = slices.Delete(live, i, i+1)
			terms++
		case op < 8:
			i, p := pick()
			require.NoError(t, p.Cmd.Process.Signal(syscall.SIGKILL))
			<-p.Done
			live = slices.Delete(live, i, i+1)
			kills++
		default:
			_, p := pick()
			if !p.frozen.CompareAndSwap(false, true) {
				continue
			}
			require.NoError(t, p.Cmd.Process.Signal(syscall.SIGSTOP))
			freezes++
			thaws.Add(1)
			time.AfterFunc(time.Duration(rng.Int64N(int64(2*session))), func() { // the freeze's length
				defer thaws.Done()
				_ = p.Cmd.Process.Signal(syscall.SIGCONT)
				p.frozen.Store(false)
			})
		}
	}
	thaws.Wait()
	t.Logf("%d spawned, %d SIGTERM, %d SIGKILL, %d SIGSTOP", spawned, terms, kills, freezes)
	close(stopProducing)
	<-producerDone
	if len(live) == 0 {
		spawnChild(t, "last", env...)
	}
	waitFor(t, 60*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })
	stopWatch()

	var n, distinct, mismatched int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (partition, "offset")) FROM `+
		pgx.Identifier{effects}.Sanitize()).Scan(&n, &distinct))
	require.EqualValues(t, produced.Load(), n, "every event recorded exactly once")
	require.Equal(t, n, distinct)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.consumer_offsets co
		WHERE co.stream_name = $1 AND co.group_id = $2
		  AND co."offset" <> (SELECT coalesce(max(x."offset") + 1, 0) FROM `+pgx.Identifier{effects}.Sanitize()+` x
		                       WHERE x.partition = co.partition)`, stream, group).Scan(&mismatched))
	require.Zero(t, mismatched, "the offsets and the effects agree")
}
