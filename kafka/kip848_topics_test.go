package kafka

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// topicAssignments tracks what each KIP-848 client owns, by topic and partition, from
// its rebalance callbacks.
type topicAssignments struct {
	mu    sync.Mutex
	owned map[string]map[kgoTP]bool // client name -> owned
}

// kgoTP is a topic's partition.
type kgoTP struct {
	Topic     string
	Partition int32
}

func (a *topicAssignments) opts(name string) []kgo.Opt {
	a.mu.Lock()
	if a.owned == nil {
		a.owned = map[string]map[kgoTP]bool{}
	}
	a.owned[name] = map[kgoTP]bool{}
	a.mu.Unlock()
	set := func(add bool) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			a.mu.Lock()
			defer a.mu.Unlock()
			for topic, ps := range m {
				for _, p := range ps {
					if add {
						a.owned[name][kgoTP{Topic: topic, Partition: p}] = true
					} else {
						delete(a.owned[name], kgoTP{Topic: topic, Partition: p})
					}
				}
			}
		}
	}
	return []kgo.Opt{kgo.OnPartitionsAssigned(set(true)), kgo.OnPartitionsRevoked(set(false)), kgo.OnPartitionsLost(set(false))}
}

// split reports whether the clients together own want exactly once, each owning some
// of every topic of want.
func (a *topicAssignments) split(want map[string]int32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	seen := map[kgoTP]int{}
	for _, owned := range a.owned {
		topics := map[string]bool{}
		for tp := range owned {
			seen[tp]++
			topics[tp.Topic] = true
		}
		if len(topics) != len(want) {
			return false
		}
	}
	n := 0
	for topic, parts := range want {
		for p := int32(0); p < parts; p++ {
			if seen[kgoTP{Topic: topic, Partition: p}] != 1 {
				return false
			}
			n++
		}
	}
	return len(seen) == n
}

// pollTopics polls cl until it received records of every partition of want, or the
// context ends.
func pollTopics(ctx context.Context, t *testing.T, cl *kgo.Client, want map[string]int32) {
	t.Helper()
	seen := map[kgoTP]bool{}
	n := 0
	for _, parts := range want {
		n += int(parts)
	}
	for len(seen) < n {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "records of %v; got %v", want, seen)
		fs.EachRecord(func(r *kgo.Record) {
			if _, ok := want[r.Topic]; ok {
				seen[kgoTP{Topic: r.Topic, Partition: r.Partition}] = true
			}
		})
	}
}

// kip848Opts are a KIP-848 consumer's options (the server's assignor).
func kip848Opts(group string, topics ...string) []kgo.Opt {
	return []kgo.Opt{kgo.ConsumerGroup(group), kgo.ConsumeTopics(topics...), kgo.ServerSideBalancer(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(),
		kgo.MetadataMinAge(100 * time.Millisecond), kgo.FetchMaxWait(200 * time.Millisecond)}
}

// TestKIP848TopicListAndRegex: franz-go KIP-848 consumers subscribed to two topics by
// name consume both and, two of them, split the partitions of both; the one member
// epoch fences their commits on the wire (FENCED_MEMBER_EPOCH for another epoch,
// STALE_MEMBER_EPOCH for the other member's partition); a consumer subscribed to a
// regex the server resolves receives the records of a topic created after it joined.
func TestKIP848TopicListAndRegex(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{ConsumerGroupSessionTimeout: 3 * time.Second,
		ConsumerGroupHeartbeatInterval: 200 * time.Millisecond})
	ctx := testCtx(t)
	prefix := testdb.Name("k848")
	t1, t2, later := prefix+"-one", prefix+"-two", prefix+"-later"
	want := map[string]int32{t1: 3, t2: 2}
	client := streams.NewClient(pool, nil)
	for topic, parts := range want {
		require.NoError(t, client.CreateStream(ctx, topic, parts))
		produceTopic(t, pool, topic, parts, 5)
	}

	t.Run("topic list", func(t *testing.T) {
		group := testdb.Name("kg")
		var owned topicAssignments
		a := newClient(t, []string{ts.addr}, append(kip848Opts(group, t1, t2), owned.opts("a")...)...)
		pollTopics(ctx, t, a, want)
		b := newClient(t, []string{ts.addr}, append(kip848Opts(group, t1, t2), owned.opts("b")...)...)
		go func() {
			for ctx.Err() == nil && !b.PollFetches(ctx).IsClientClosed() {
			}
		}()
		go func() {
			for ctx.Err() == nil && !a.PollFetches(ctx).IsClientClosed() {
			}
		}()
		require.Eventually(t, func() bool { return owned.split(want) }, 30*time.Second, 20*time.Millisecond,
			"two members split the partitions of both topics")

		// Fencing on the wire, with the one member epoch.
		memberA, epochA := a.GroupMetadata()
		owned.mu.Lock()
		var ofA, ofB kgoTP
		for tp := range owned.owned["a"] {
			ofA = tp
		}
		for tp := range owned.owned["b"] {
			ofB = tp
		}
		owned.mu.Unlock()
		commit := func(epoch int32, tp kgoTP) int16 {
			req := kmsg.NewPtrOffsetCommitRequest()
			req.Group, req.MemberID, req.Generation = group, memberA, epoch
			rt := kmsg.NewOffsetCommitRequestTopic()
			rt.Topic = tp.Topic
			rp := kmsg.NewOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset = tp.Partition, 1
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
			resp, err := req.RequestWith(ctx, a)
			require.NoError(t, err)
			return resp.Topics[0].Partitions[0].ErrorCode
		}
		require.Equal(t, kerr.FencedMemberEpoch.Code, commit(epochA+1, ofA), "another epoch")
		require.Equal(t, kerr.StaleMemberEpoch.Code, commit(epochA, ofB), "the other member's partition")
		require.Zero(t, commit(epochA, ofA), "its own partition, at its epoch")
		offs, err := ts.srv.groups.FetchOffsets(ctx, group, []string{ofB.Topic})
		require.NoError(t, err)
		for _, o := range offs {
			require.False(t, o.Partition == ofB.Partition && o.Offset == 1, "a refused commit wrote nothing")
		}
	})

	t.Run("regex", func(t *testing.T) {
		group := testdb.Name("kg")
		c := newClient(t, []string{ts.addr}, append(kip848Opts(group, "^"+prefix+"-.*$"), kgo.ConsumeRegex())...)
		pollTopics(ctx, t, c, want)
		// A topic created after the member joined: the server's resolution of the
		// regex takes it in at a heartbeat, and its records arrive.
		require.NoError(t, client.CreateStream(ctx, later, 2))
		produceTopic(t, pool, later, 2, 3)
		pollTopics(ctx, t, c, map[string]int32{later: 2})
	})
}

// TestKill9ChildKIP848MultiTopicConsumers: KIP-848 consumers in child processes share
// a group over two topics (one subscribed by name, one by a regex); one is killed with
// SIGKILL while it owns partitions of both topics; another joins later. The dead
// member's partitions of every topic move (its session expires); in the end every
// record of both topics was processed, nothing was lost, and no committed offset went
// backwards.
func TestKill9ChildKIP848MultiTopicConsumers(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{ConsumerGroupSessionTimeout: 3 * time.Second,
		ConsumerGroupHeartbeatInterval: 200 * time.Millisecond})
	prefix, group := testdb.Name("kk"), testdb.Name("kg")
	t1, t2 := prefix+"-one", prefix+"-two"
	want := map[string]int32{t1: 3, t2: 2}
	for topic, parts := range want {
		require.NoError(t, streams.NewClient(pool, nil).CreateStream(context.Background(), topic, parts))
	}
	table := processedTable(t, pool)
	watches := []*offsetWatch{watchOffsets(t, pool, t1, group), watchOffsets(t, pool, t2, group)}
	produce := func(n int) {
		for topic, parts := range want {
			produceTopic(t, pool, topic, parts, n)
		}
	}

	spawn := func(regex bool) *groupChild {
		topics, re := t1+","+t2, "0"
		if regex {
			topics, re = "^"+prefix+"-.*$", "1"
		}
		return spawnGroupChild(t, "KG_URL="+testdb.URL(t), "KG_TABLE="+table,
			"KG_TOPIC="+topics, "KG_REGEX="+re, "KG_GROUP="+group, "KG_ADDRS="+ts.addr, "KG_BALANCER=kip848")
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if !assert.Eventually(t, cond, 60*time.Second, 20*time.Millisecond, what) {
			logKIP848State(t, pool, group)
			t.FailNow()
		}
	}

	produce(50)
	a, _ := spawn(false), spawn(true)
	// Keep records coming until each member processed records of both topics (the
	// first to join may read a burst alone).
	var fed time.Time
	waitFor("two members processing both topics", func() bool {
		if membersOfBothTopics(t, pool, table) == 2 {
			return true
		}
		if time.Since(fed) > 250*time.Millisecond {
			produce(5)
			fed = time.Now()
		}
		return false
	})
	require.NoError(t, a.Cmd.Process.Signal(syscall.SIGKILL))
	<-a.Done
	produce(50)
	spawn(false)
	fed = time.Time{}
	waitFor("the later member processing", func() bool {
		if membersRecorded(t, pool, table) == 3 {
			return true
		}
		if time.Since(fed) > 250*time.Millisecond {
			produce(5)
			fed = time.Now()
		}
		return false
	})
	produce(50)
	waitFor("everything committed", func() bool { return groupLagZero(t, pool, t1, group) && groupLagZero(t, pool, t2, group) })
	requireAllProcessed(t, pool, t1, table)
	requireAllProcessed(t, pool, t2, table)
	for _, w := range watches {
		w.check(t)
	}
	// The killed member (recorded, no longer a live member) had partitions of both
	// topics, and owns nothing any more.
	var dead []string
	rows, err := pool.Query(context.Background(), `SELECT DISTINCT x.member FROM `+pgx.Identifier{table}.Sanitize()+` x
		WHERE NOT EXISTS (SELECT 1 FROM streamd.kafka_consumer_members m
		                   WHERE m.group_id = $1 AND m.member_id = x.member
		                     AND m.last_heartbeat + m.session_timeout_ms * interval '1 millisecond' >= now())`, group)
	require.NoError(t, err)
	dead, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, dead, 1, "one member was killed")
	var topics, owned int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT
		(SELECT count(DISTINCT topic) FROM `+pgx.Identifier{table}.Sanitize()+` WHERE member = $2),
		(SELECT count(*) FROM streamd.consumer_partitions WHERE group_id = $1 AND $2 IN (owner_id, target_id))`,
		group, dead[0]).Scan(&topics, &owned))
	require.Equal(t, 2, topics, "the killed member consumed both topics")
	require.Zero(t, owned, "its partitions of every topic moved")
}

// membersOfBothTopics counts the members that processed records of two topics.
func membersOfBothTopics(t *testing.T, pool *pgxpool.Pool, table string) int {
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT member FROM `+
		pgx.Identifier{table}.Sanitize()+` GROUP BY member HAVING count(DISTINCT topic) >= 2) m`).Scan(&n))
	return n
}

// logKIP848State logs a group's KIP-848 members and who owns what, for a test that
// timed out waiting.
func logKIP848State(t *testing.T, pool *pgxpool.Pool, group string) {
	logQueries(t, pool, group,
		`SELECT member_id, member_epoch, subscribed_topics, subscribed_regex, last_heartbeat, now()
		   FROM streamd.kafka_consumer_members WHERE group_id = $1`,
		`SELECT stream_name, partition, owner_id, owner_epoch, target_id FROM streamd.consumer_partitions
		  WHERE group_id = $1 ORDER BY 1, 2`)
}
