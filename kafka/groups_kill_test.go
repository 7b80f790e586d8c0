package kafka

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// groupChildEnv makes the test binary run groupChildMain instead of the tests: a
// franz-go group consumer in a process of its own, for kill -9.
const groupChildEnv = "STREAMD_KAFKA_GROUP_CHILD"

// groupChildMain consumes a topic (KG_TOPIC; several, comma-separated, or a regex with
// KG_REGEX=1, for KIP-848 members) in a group with franz-go and records each record it
// processed in a table (topic, partition, offset, member; duplicates allowed: at-least-once),
// committing only what it recorded, until killed. Rebalances are held off while a
// polled batch is recorded and committed (BlockRebalanceOnPoll), as an at-least-once
// consumer that must never commit a partition it lost does.
func groupChildMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("KG_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	balancer := kgo.RangeBalancer()
	if os.Getenv("KG_BALANCER") == "cooperative-sticky" {
		balancer = kgo.CooperativeStickyBalancer()
	}
	opts := append(groupClientOpts(os.Getenv("KG_GROUP"), os.Getenv("KG_TOPIC"), balancer),
		kgo.SeedBrokers(strings.Split(os.Getenv("KG_ADDRS"), ",")...),
		kgo.BlockRebalanceOnPoll(), kgo.FetchMaxWait(200*time.Millisecond))
	if os.Getenv("KG_BALANCER") == "kip848" {
		opts = append(opts, kgo.ServerSideBalancer(), kgo.ConsumeTopics(strings.Split(os.Getenv("KG_TOPIC"), ",")...))
		if os.Getenv("KG_REGEX") == "1" {
			opts = append(opts, kgo.ConsumeRegex())
		}
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	table := pgx.Identifier{os.Getenv("KG_TABLE")}.Sanitize()
	control := newChildControl()
	for ctx.Err() == nil {
		fetches := cl.PollRecords(ctx, 50)
		member, epoch := cl.GroupMetadata()
		recs := fetches.Records()
		held := len(recs) > 0 && control.holdBatch(member, epoch)
		if len(recs) > 0 {
			topics, parts, offs := make([]string, len(recs)), make([]int32, len(recs)), make([]int64, len(recs))
			for i, r := range recs {
				topics[i], parts[i], offs[i] = r.Topic, r.Partition, r.Offset
			}
			if _, err := pool.Exec(ctx, "INSERT INTO "+table+` (topic, partition, "offset", member)
				SELECT t, p, o, $4 FROM unnest($1::text[], $2::int[], $3::bigint[]) AS u(t, p, o)`, topics, parts, offs, member); err != nil {
				fmt.Fprintln(os.Stderr, "record:", err)
				cl.AllowRebalance()
				continue
			}
			// Refused commits (a rebalance took the partition) are redelivered to
			// the next owner: at-least-once.
			// The epoch the commit goes out with: the client's, read just before it (a
			// resumed client may have rejoined since the batch was polled).
			_, sent := cl.GroupMetadata()
			err := cl.CommitRecords(ctx, recs...)
			if err != nil {
				fmt.Fprintln(os.Stderr, "commit:", err)
			}
			if held {
				control.committed(sent, err)
			}
		}
		cl.AllowRebalance()
	}
	cl.Close()
	return 0
}

// offsetWatch polls a group's committed offsets and records any that went backwards.
type offsetWatch struct {
	mu        sync.Mutex
	last      map[int32]int64
	regressed []string
}

func watchOffsets(t *testing.T, pool *pgxpool.Pool, topic, group string) *offsetWatch {
	w := &offsetWatch{last: map[int32]int64{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			rows, err := pool.Query(ctx, `SELECT partition, "offset" FROM streamd.consumer_offsets
				WHERE stream_name = $1 AND group_id = $2`, topic, group)
			if err == nil {
				var p int32
				var o int64
				_, _ = pgx.ForEachRow(rows, []any{&p, &o}, func() error {
					w.mu.Lock()
					defer w.mu.Unlock()
					if prev, ok := w.last[p]; ok && o < prev {
						w.regressed = append(w.regressed, fmt.Sprintf("partition %d: %d after %d", p, o, prev))
					}
					w.last[p] = o
					return nil
				})
			}
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

func (w *offsetWatch) check(t *testing.T) {
	w.mu.Lock()
	defer w.mu.Unlock()
	require.Empty(t, w.regressed, "committed offsets went backwards")
}

// groupLagZero reports whether every partition of the topic is committed up to its
// log end.
func groupLagZero(t *testing.T, pool *pgxpool.Pool, topic, group string) bool {
	var behind int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM streamd.stream_partitions h
		LEFT JOIN streamd.consumer_offsets co ON co.stream_name = h.stream_name AND co.partition = h.partition AND co.group_id = $2
		WHERE h.stream_name = $1 AND coalesce(co."offset", 0) < h.next_offset`, topic, group).Scan(&behind))
	return behind == 0
}

// produceTopic appends n records to each partition of a topic with the native
// producer (Kafka consumers read what any door wrote).
// keepProducingUntil reports whether members members have processed records into
// table, and when not yet, produces two more records to every partition: a member
// that joins after the others have read all there was would otherwise process
// nothing (make test failed TestGroupCarriesOnAcrossInstances so, the first consumer
// reading the whole backlog before the second had joined).
func keepProducingUntil(t *testing.T, pool *pgxpool.Pool, topic string, partitions int32, table string, members int) bool {
	t.Helper()
	if membersRecorded(t, pool, table) >= members {
		return true
	}
	produceTopic(t, pool, topic, partitions, 2)
	return false
}

func produceTopic(t *testing.T, pool *pgxpool.Pool, topic string, partitions int32, n int) {
	t.Helper()
	var recs []streams.Record
	for p := int32(0); p < partitions; p++ {
		for i := 0; i < n; i++ {
			recs = append(recs, streams.Record{Stream: topic, Partition: &p, Bytes: []byte(fmt.Sprintf("%d-%d", p, i))})
		}
	}
	_, err := streams.NewClient(pool, nil).Produce(context.Background(), recs...)
	require.NoError(t, err)
}

// logGroupState logs a classic group's members and who processed how much, for a
// test that timed out waiting.
func logGroupState(t *testing.T, pool *pgxpool.Pool, group, table string) {
	logQueries(t, pool, group,
		`SELECT g.state, g.generation, m.member_id, m.joined, m.generation, m.last_heartbeat, now()
		   FROM streamd.kafka_groups g LEFT JOIN streamd.kafka_group_members m USING (group_id) WHERE g.group_id = $1`,
		`SELECT member, count(*) FROM `+pgx.Identifier{table}.Sanitize()+` WHERE $1::text IS NOT NULL GROUP BY 1`)
}

// logQueries logs the rows of each query, run with group as its $1 (a failed
// test's diagnostics: errors are logged, not fatal).
func logQueries(t *testing.T, pool *pgxpool.Pool, group string, queries ...string) {
	for _, q := range queries {
		rows, err := pool.Query(context.Background(), q, group)
		if err != nil {
			t.Log(err)
			continue
		}
		for rows.Next() {
			v, _ := rows.Values()
			t.Log(v...)
		}
		rows.Close()
	}
}

// requireAllProcessed checks that every record of the topic was recorded at least once
// (rows with an empty topic are of the test's only topic).
func requireAllProcessed(t *testing.T, pool *pgxpool.Pool, topic, table string) {
	t.Helper()
	var missing int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM streamd.events e
		WHERE e.stream_name = $1 AND NOT EXISTS (SELECT 1 FROM `+pgx.Identifier{table}.Sanitize()+` x
		                                          WHERE x.topic IN ('', e.stream_name)
		                                            AND x.partition = e.partition AND x."offset" = e."offset")`,
		topic).Scan(&missing))
	require.Zero(t, missing, "records never processed")
}

func processedTable(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	table := strings.ReplaceAll(testdb.Name("kg_processed"), "-", "_")
	_, err := pool.Exec(context.Background(), "CREATE TABLE "+pgx.Identifier{table}.Sanitize()+
		` (topic text NOT NULL DEFAULT '', partition int NOT NULL, "offset" bigint NOT NULL, member text NOT NULL)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+pgx.Identifier{table}.Sanitize()) })
	return table
}

func membersRecorded(t *testing.T, pool *pgxpool.Pool, table string) int {
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(DISTINCT member) FROM "+
		pgx.Identifier{table}.Sanitize()).Scan(&n))
	return n
}

// TestKill9ChildGroupConsumers: franz-go group consumers in child processes (classic
// range and cooperative-sticky, and KIP-848 with the server-side assignor) share a topic; one is killed with SIGKILL mid-stream, another
// joins later; the group heals (the dead member's session expires) and in the end every
// record was processed, nothing was lost, and no committed offset ever went backwards.
func TestKill9ChildGroupConsumers(t *testing.T) {
	t.Parallel()
	for _, balancer := range []string{"range", "cooperative-sticky", "kip848"} {
		t.Run(balancer, func(t *testing.T) {
			t.Parallel()
			pool := testdb.Pool(t)
			// KIP-848 members' session timeout is the server's (3s here, like the
			// classic members' groupClientOpts).
			ts := startServer(t, pool, &Config{ConsumerGroupSessionTimeout: 3 * time.Second,
				ConsumerGroupHeartbeatInterval: 200 * time.Millisecond})
			topic, group := testdb.Name("kg"), testdb.Name("kg")
			const partitions = 4
			require.NoError(t, streams.NewClient(pool, nil).CreateStream(context.Background(), topic, partitions))
			table := processedTable(t, pool)
			watch := watchOffsets(t, pool, topic, group)

			spawn := func() *groupChild {
				return spawnGroupChild(t, "KG_URL="+testdb.URL(t), "KG_TABLE="+table,
					"KG_TOPIC="+topic, "KG_GROUP="+group, "KG_ADDRS="+ts.addr, "KG_BALANCER="+balancer)
			}
			waitFor := func(what string, cond func() bool) {
				t.Helper()
				if !assert.Eventually(t, cond, 60*time.Second, 20*time.Millisecond, what) {
					logGroupState(t, pool, group, table)
					t.FailNow()
				}
			}

			produceTopic(t, pool, topic, partitions, 100)
			a, b := spawn(), spawn()
			waitFor("two members processing", func() bool { return keepProducingUntil(t, pool, topic, partitions, table, 2) })
			require.NoError(t, a.Cmd.Process.Signal(syscall.SIGKILL))
			<-a.Done
			produceTopic(t, pool, topic, partitions, 100)
			spawn()
			// Keep records coming until the later member processed some: the survivor
			// may have read everything before the later member's join completed.
			var fed time.Time
			waitFor("the later member processing", func() bool {
				if membersRecorded(t, pool, table) == 3 {
					return true
				}
				if time.Since(fed) > 250*time.Millisecond {
					produceTopic(t, pool, topic, partitions, 5)
					fed = time.Now()
				}
				return false
			})
			produceTopic(t, pool, topic, partitions, 100)
			waitFor("everything committed", func() bool { return groupLagZero(t, pool, topic, group) })

			requireAllProcessed(t, pool, topic, table)
			watch.check(t)
			_ = b
			// The members used the protocol asked for: KIP-848 members are members of
			// the stream's native group, classic ones of a classic group.
			kg, err := ts.srv.groups.DescribeKafkaGroup(context.Background(), group)
			require.NoError(t, err)
			if balancer == "kip848" {
				require.Equal(t, consumergroup.GroupTypeConsumer, kg.Type)
				d, err := consumergroup.NewAdmin(pool).DescribeGroup(context.Background(), topic, group)
				require.NoError(t, err)
				require.GreaterOrEqual(t, d.GroupEpoch, int64(3), "three joins at least")
			} else {
				require.Equal(t, consumergroup.GroupTypeClassic, kg.Type)
			}
		})
	}
}

// TestGroupCarriesOnAcrossInstances: two Server instances on one database; group
// consumers talk to the first, which is stopped mid-stream: they find the other
// (FindCoordinator answers any live instance, and the group lives in PostgreSQL) and
// carry on, processing everything, with no offset going backwards.
func TestGroupCarriesOnAcrossInstances(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	listener := testdb.Name("two")
	first := startServer(t, pool, &Config{Listener: listener})
	second := startServer(t, pool, &Config{Listener: listener})
	ctx := testCtx(t)
	topic, group := testdb.Name("kg"), testdb.Name("kg")
	const partitions = 4
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, partitions))
	table := processedTable(t, pool)
	watch := watchOffsets(t, pool, topic, group)

	var wg sync.WaitGroup
	cctx, stopConsumers := context.WithCancel(ctx)
	t.Cleanup(func() { stopConsumers(); wg.Wait() })
	consume := func(name string) {
		ctx := cctx
		cl := newClient(t, []string{first.addr}, append(groupClientOpts(group, topic, kgo.CooperativeStickyBalancer()),
			kgo.BlockRebalanceOnPoll(), kgo.FetchMaxWait(200*time.Millisecond))...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				fetches := cl.PollRecords(ctx, 50)
				if fetches.IsClientClosed() {
					return
				}
				recs := fetches.Records()
				if len(recs) > 0 {
					member, _ := cl.GroupMetadata()
					parts, offs := make([]int32, len(recs)), make([]int64, len(recs))
					for i, r := range recs {
						parts[i], offs[i] = r.Partition, r.Offset
					}
					if _, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{table}.Sanitize()+` (partition, "offset", member)
						SELECT p, o, $3 FROM unnest($1::int[], $2::bigint[]) AS u(p, o)`, parts, offs, member+"/"+name); err == nil {
						_ = cl.CommitRecords(ctx, recs...)
					}
				}
				cl.AllowRebalance()
			}
		}()
	}
	consume("c1")
	consume("c2")

	produceTopic(t, pool, topic, partitions, 100)
	require.Eventually(t, func() bool { return keepProducingUntil(t, pool, topic, partitions, table, 2) }, 60*time.Second, 20*time.Millisecond)
	first.stop()
	produceTopic(t, pool, topic, partitions, 100)
	require.Eventually(t, func() bool { return groupLagZero(t, pool, topic, group) }, 60*time.Second, 20*time.Millisecond,
		"the consumers carried on through the second instance")
	requireAllProcessed(t, pool, topic, table)
	watch.check(t)
	_ = second
}

// groupChild is a consumer child process (groupChildEnv) of the kill tests.
type groupChild = testdb.Child

// spawnGroupChild starts this test binary as a group consumer with env added to the
// environment (testdb.StartChild: the test's cleanup kills it).
func spawnGroupChild(t *testing.T, env ...string) *groupChild {
	t.Helper()
	return testdb.StartChild(t, testdb.ChildOpts{Env: append([]string{groupChildEnv + "=1"}, env...)})
}
