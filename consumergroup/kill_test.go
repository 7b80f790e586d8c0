package consumergroup

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// The test binary re-executes itself as a consumer process when this is set; the
// child prints childReady once SIGTERM stops it cleanly.
const (
	childEnv   = "STREAMD_CG_CHILD"
	childReady = "streamd-consumer-ready"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(childMain())
	}
	if os.Getenv(stallChildEnv) == "1" {
		os.Exit(stallChildMain())
	}
	os.Exit(m.Run())
}

// childMain runs one consumer in CommitTransactional mode that records each event in
// a table in the same transaction as the offset commit, until killed or stopped with
// SIGTERM (a clean stop: Run's ctx is cancelled; it then exits 0). Optional knobs:
// STREAMD_CG_ID (Config.ConsumerID), STREAMD_CG_SESSION (SessionTimeout, default
// 1s), STREAMD_CG_WORK (the handler's work between its write and its commit, default
// 2ms), STREAMD_CG_ATTEMPTS (a table recording each handler call's first offset,
// outside its transaction) and STREAMD_CG_LOST (a table recording OnLost calls).
func childMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fmt.Println(childReady) // SIGTERM is a clean stop from now on
	pool, err := pgxpool.New(ctx, os.Getenv("STREAMD_CG_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	table := pgx.Identifier{os.Getenv("STREAMD_CG_TABLE")}.Sanitize()
	cfg := testConfig(os.Getenv("STREAMD_CG_STREAM"), os.Getenv("STREAMD_CG_GROUP"))
	cfg.ConsumerID = os.Getenv("STREAMD_CG_ID")
	cfg.SessionTimeout = time.Second
	if d, err := time.ParseDuration(os.Getenv("STREAMD_CG_SESSION")); err == nil {
		cfg.SessionTimeout, cfg.HeartbeatInterval = d, d/5
	}
	work := 2 * time.Millisecond // widen the window between write and commit for the kill
	if d, err := time.ParseDuration(os.Getenv("STREAMD_CG_WORK")); err == nil {
		work = d
	}
	cfg.CommitMode = CommitTransactional
	cfg.MaxBatchSize = 5
	if lost := os.Getenv("STREAMD_CG_LOST"); lost != "" {
		cfg.OnLost = func(ctx context.Context, m Membership, ps []int32) {
			_, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{lost}.Sanitize()+" (member, partitions) VALUES ($1, $2)", m.MemberID, ps)
			if err != nil {
				fmt.Fprintln(os.Stderr, "record OnLost:", err)
			}
		}
	}
	attempts := os.Getenv("STREAMD_CG_ATTEMPTS")
	c, err := New(pool, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	err = c.Run(ctx, func(ctx context.Context, b *Batch) error {
		if attempts != "" {
			if _, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{attempts}.Sanitize()+` (partition, first, member) VALUES ($1, $2, $3)`,
				b.Partition, b.Events[0].Offset, b.MemberID); err != nil {
				return err
			}
		}
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, e := range b.Events {
				if _, err := tx.Exec(ctx, "INSERT INTO "+table+` (partition, "offset", member) VALUES ($1, $2, $3)`,
					e.Partition, e.Offset, b.MemberID); err != nil {
					return err
				}
			}
			select { // the batch's work, which a clean stop lets finish
			case <-time.After(work):
			case <-ctx.Done():
				return ctx.Err()
			}
			return b.CommitTx(ctx, tx)
		})
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestKill9ChildConsumers: consumer processes are killed with SIGKILL while they
// process (mid-transaction, between write and commit); the survivors take their
// partitions after the session timeout, and in the end every event was recorded
// exactly once (the table's primary key refuses a second record, and a refused
// record would block its partition, so the lag would never reach zero).
func TestKill9ChildConsumers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	stream := newStream(t, pool, 4)
	group := testdb.Name("g")
	table := strings.ReplaceAll(testdb.Name("cg_kill"), "-", "_")
	_, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{table}.Sanitize()+
		` (partition int, "offset" bigint, member text NOT NULL, PRIMARY KEY (partition, "offset"))`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+pgx.Identifier{table}.Sanitize()) })

	spawn := func() *testdb.Child {
		return testdb.StartChild(t, testdb.ChildOpts{Env: []string{childEnv + "=1", "STREAMD_CG_URL=" + testdb.URL(t), "STREAMD_CG_TABLE=" + table,
			"STREAMD_CG_STREAM=" + stream, "STREAMD_CG_GROUP=" + group,
			"STREAMD_CG_SESSION=3s"}}) // 1s sessions expired under a loaded machine's delays: churn, no commits
	}
	kill := func(ch *testdb.Child) {
		require.NoError(t, ch.Cmd.Process.Signal(syscall.SIGKILL))
		<-ch.Done
	}
	recordedBy := func() map[string]int {
		rows, err := pool.Query(ctx, "SELECT member, count(*) FROM "+pgx.Identifier{table}.Sanitize()+" GROUP BY member")
		require.NoError(t, err)
		out := map[string]int{}
		for rows.Next() {
			var m string
			var n int
			require.NoError(t, rows.Scan(&m, &n))
			out[m] = n
		}
		require.NoError(t, rows.Err())
		return out
	}

	total := len(produce(t, pool, stream, 0, 300))
	// Until every member wanted has recorded something, events keep coming whenever
	// the group has recorded all there are: on a fast machine the first child to join
	// drained the first 300 before the second had partitions, and the second then
	// never recorded anything (a CI run timed out so).
	more := 100000
	membersRecorded := func(want int) func() bool {
		return func() bool {
			by := recordedBy()
			if len(by) >= want {
				return true
			}
			n := 0
			for _, c := range by {
				n += c
			}
			if n == total {
				total += len(produce(t, pool, stream, more, 20))
				more += 20
			}
			return false
		}
	}
	a, b := spawn(), spawn()
	waitFor(t, 60*time.Second, "both children processing", membersRecorded(2))
	kill(a)
	total += len(produce(t, pool, stream, 300, 300))
	c := spawn()
	waitFor(t, 60*time.Second, "three members recorded", membersRecorded(3))
	total += len(produce(t, pool, stream, 600, 300))
	kill(b)
	waitFor(t, 60*time.Second, "lag 0", func() bool { return groupLag(t, pool, stream, group) == 0 })

	var n, distinct int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (partition, "offset")) FROM `+
		pgx.Identifier{table}.Sanitize()).Scan(&n, &distinct))
	require.Equal(t, total, n, "every event recorded exactly once")
	require.Equal(t, n, distinct)
	// The table and the offsets agree: what was committed was recorded, nothing more.
	var mismatched int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM streamd.consumer_offsets co
		WHERE co.stream_name = $1 AND co.group_id = $2
		  AND co."offset" <> (SELECT coalesce(max(x."offset") + 1, 0) FROM `+pgx.Identifier{table}.Sanitize()+` x
		                       WHERE x.partition = co.partition)`, stream, group).Scan(&mismatched))
	require.Zero(t, mismatched)
	_ = c
}
