package kafka

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// childControl lets a test hold a group child's batch (KG_CONTROL=1): the test writes
// "hold" to the child's stdin; at its next polled batch the child prints "held
// <member> <epoch>" and waits for "go" before it records and commits that batch, then
// prints "commit <epoch> ok" or "commit <epoch> <error>", with the epoch the client
// held just before it committed. The test can so freeze the
// child (SIGSTOP) with a batch in flight whose commit comes after its partitions moved.
type childControl struct {
	cmds chan string // stdin lines; nil when the child is not controlled
	hold bool
}

func newChildControl() *childControl {
	c := &childControl{}
	if os.Getenv("KG_CONTROL") != "1" {
		return c
	}
	c.cmds = make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			c.cmds <- sc.Text()
		}
		close(c.cmds)
	}()
	return c
}

// holdBatch reports whether the batch just polled is held: when a hold was asked for,
// it says so on stdout and returns once the test said "go".
func (c *childControl) holdBatch(member string, epoch int32) bool {
	if c.cmds == nil {
		return false
	}
	for !c.hold {
		select {
		case cmd := <-c.cmds:
			c.hold = cmd == "hold"
			continue
		default:
		}
		break
	}
	if !c.hold {
		return false
	}
	c.hold = false
	fmt.Printf("held %s %d\n", member, epoch)
	for cmd := range c.cmds {
		if cmd == "go" {
			break
		}
	}
	return true
}

// committed reports a held batch's commit on stdout.
func (c *childControl) committed(epoch int32, err error) {
	res := "ok"
	if err != nil {
		res = strings.ReplaceAll(err.Error(), "\n", " ")
	}
	fmt.Printf("commit %d %s\n", epoch, res)
}

// controlledChild is a group child with its stdin and stdout lines (KG_CONTROL=1).
type controlledChild struct {
	*groupChild
	lines chan string
}

// spawnControlledChild starts a group child that a test controls (childControl); its
// lines channel is closed once the child exited.
func spawnControlledChild(t *testing.T, env ...string) *controlledChild {
	t.Helper()
	lines := make(chan string, 64)
	ch := &controlledChild{lines: lines}
	ch.groupChild = testdb.StartChild(t, testdb.ChildOpts{Env: append([]string{groupChildEnv + "=1", "KG_CONTROL=1"}, env...),
		Stdin: true, Line: func(l string) { lines <- l }})
	go func() { <-ch.Done; close(lines) }() // Done closes after the last line
	return ch
}

// send writes a command line to the child.
func (c *controlledChild) send(t *testing.T, cmd string) {
	t.Helper()
	_, err := fmt.Fprintln(c.Stdin, cmd)
	require.NoError(t, err)
}

// line returns the child's next stdout line that starts with prefix.
func (c *controlledChild) line(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			require.True(t, ok, "the child ended before printing %q", prefix)
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline:
			t.Fatalf("no %q line from the child in 60s", prefix)
		}
	}
}

// multiTopicGroup is a KIP-848 group over two topics for the process tests: the topics,
// the table the children record into, and watches on the committed offsets.
type multiTopicGroup struct {
	pool          *pgxpool.Pool
	ts            *testServer
	prefix, group string
	want          map[string]int32
	table         string
	watches       []*offsetWatch
}

func newMultiTopicGroup(t *testing.T) *multiTopicGroup {
	pool := testdb.Pool(t)
	g := &multiTopicGroup{pool: pool, prefix: testdb.Name("kk"), group: testdb.Name("kg")}
	g.ts = startServer(t, pool, &Config{ConsumerGroupSessionTimeout: 3 * time.Second,
		ConsumerGroupHeartbeatInterval: 200 * time.Millisecond})
	g.want = map[string]int32{g.prefix + "-one": 3, g.prefix + "-two": 2}
	for topic, parts := range g.want {
		require.NoError(t, streams.NewClient(pool, nil).CreateStream(context.Background(), topic, parts))
		g.watches = append(g.watches, watchOffsets(t, pool, topic, g.group))
	}
	g.table = processedTable(t, pool)
	return g
}

// env is a child's environment: subscribed to both topics by name, or by a regex.
func (g *multiTopicGroup) env(t *testing.T, regex bool) []string {
	topics, re := g.prefix+"-one,"+g.prefix+"-two", "0"
	if regex {
		topics, re = "^"+g.prefix+"-.*$", "1"
	}
	return []string{"KG_URL=" + testdb.URL(t), "KG_TABLE=" + g.table, "KG_TOPIC=" + topics, "KG_REGEX=" + re,
		"KG_GROUP=" + g.group, "KG_ADDRS=" + g.ts.addr, "KG_BALANCER=kip848"}
}

func (g *multiTopicGroup) produce(t *testing.T, n int) {
	for topic, parts := range g.want {
		produceTopic(t, g.pool, topic, parts, n)
	}
}

// waitFor polls cond, producing a few records to every partition now and then (a
// member that joins after the others read everything would otherwise see nothing).
func (g *multiTopicGroup) waitFor(t *testing.T, what string, feed bool, cond func() bool) {
	t.Helper()
	var fed time.Time
	if !assert.Eventually(t, func() bool {
		if cond() {
			return true
		}
		if feed && time.Since(fed) > 250*time.Millisecond {
			g.produce(t, 5)
			fed = time.Now()
		}
		return false
	}, 60*time.Second, 20*time.Millisecond, what) {
		logKIP848State(t, g.pool, g.group)
		t.FailNow()
	}
}

func (g *multiTopicGroup) lagZero(t *testing.T) bool {
	for topic := range g.want {
		if !groupLagZero(t, g.pool, topic, g.group) {
			return false
		}
	}
	return true
}

// finish checks the group's invariants: every record of both topics processed,
// committed offsets never went backwards.
func (g *multiTopicGroup) finish(t *testing.T) {
	for topic := range g.want {
		requireAllProcessed(t, g.pool, topic, g.table)
	}
	for _, w := range g.watches {
		w.check(t)
	}
}

// owns counts the partitions of the group a member owns or is to own.
func (g *multiTopicGroup) owns(t *testing.T, member string) int {
	var n int
	require.NoError(t, g.pool.QueryRow(context.Background(), `SELECT count(*) FROM streamd.consumer_partitions
		WHERE group_id = $1 AND $2 IN (owner_id, target_id)`, g.group, member).Scan(&n))
	return n
}

// liveMembers lists the group's KIP-848 member rows (live or lapsed).
func (g *multiTopicGroup) members(t *testing.T) []string {
	rows, err := g.pool.Query(context.Background(), `SELECT member_id FROM streamd.kafka_consumer_members
		WHERE group_id = $1 ORDER BY 1`, g.group)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

// TestFrozenChildKIP848MultiTopicConsumers: KIP-848 consumers in child processes share
// a group over two topics (one by name, one by a regex). One is frozen with SIGSTOP
// (every thread stopped) while it holds a polled batch, not yet committed, of
// partitions it owns; while it is frozen its session lapses and the other member takes
// its partitions of both topics and processes everything produced meanwhile. Resumed
// (SIGCONT), it commits the batch it held with the epoch it had: refused (the member is
// no longer live at that epoch), so no committed offset goes back. The group then goes
// on with both, and in the end every record of both topics was processed.
func TestFrozenChildKIP848MultiTopicConsumers(t *testing.T) {
	t.Parallel()
	g := newMultiTopicGroup(t)
	g.produce(t, 50)
	a := spawnControlledChild(t, g.env(t, false)...)
	spawnGroupChild(t, g.env(t, true)...)
	g.waitFor(t, "two members processing both topics", true, func() bool { return membersOfBothTopics(t, g.pool, g.table) == 2 })

	a.send(t, "hold")
	g.produce(t, 5)
	held := strings.Fields(a.line(t, "held "))
	require.Len(t, held, 3)
	member := held[1]
	epoch, err := strconv.Atoi(held[2])
	require.NoError(t, err)
	testdb.StopProcess(t, a.Cmd.Process.Pid)

	// The group carries on without it: its partitions of both topics move to the
	// other member, which processes and commits everything produced meanwhile.
	g.produce(t, 50)
	g.waitFor(t, "the frozen member's partitions moved", false, func() bool { return g.owns(t, member) == 0 })
	g.waitFor(t, "everything committed while it is frozen", false, func() bool { return g.lagZero(t) })

	require.NoError(t, syscall.Kill(a.Cmd.Process.Pid, syscall.SIGCONT))
	a.send(t, "go")
	commitLine := a.line(t, "commit ")
	t.Log(commitLine)
	commit := strings.Fields(commitLine)
	require.Equal(t, strconv.Itoa(epoch), commit[1], "the held batch is committed with the epoch it was polled at (the client had not rejoined first)")
	require.NotEqual(t, "ok", commit[2], "the resumed member's commit is fenced: %v", commit)

	// It comes back (a new epoch) and the group goes on with both.
	g.produce(t, 50)
	g.waitFor(t, "everything committed after it resumed", true, func() bool { return g.lagZero(t) })
	g.finish(t)
}

// TestStoppedChildKIP848MultiTopicConsumers: KIP-848 consumers in child processes share
// a group over two topics (one by name, one by a regex); one is stopped with SIGTERM.
// It leaves the group as it exits (its member row is gone at once, not left to lapse),
// the other member takes its partitions of both topics, and in the end every record
// was processed and no committed offset went backwards.
func TestStoppedChildKIP848MultiTopicConsumers(t *testing.T) {
	t.Parallel()
	g := newMultiTopicGroup(t)
	g.produce(t, 50)
	a := spawnGroupChild(t, g.env(t, false)...)
	spawnGroupChild(t, g.env(t, true)...)
	g.waitFor(t, "two members processing both topics", true, func() bool { return membersOfBothTopics(t, g.pool, g.table) == 2 })
	require.Len(t, g.members(t), 2)

	require.NoError(t, a.Cmd.Process.Signal(syscall.SIGTERM))
	<-a.Done
	require.Zero(t, a.Cmd.ProcessState.ExitCode(), "it stopped cleanly")
	require.Len(t, g.members(t), 1, "it left the group as it stopped")
	survivor := g.members(t)[0]
	total := 0
	for _, parts := range g.want {
		total += int(parts)
	}
	g.waitFor(t, "the survivor owns every partition", false, func() bool {
		var n int
		require.NoError(t, g.pool.QueryRow(context.Background(), `SELECT count(*) FROM streamd.consumer_partitions
			WHERE group_id = $1 AND owner_id = $2 AND target_id IS NULL`, g.group, survivor).Scan(&n))
		return n == total
	})
	g.produce(t, 50)
	g.waitFor(t, "everything committed", false, func() bool { return g.lagZero(t) })
	g.finish(t)
}
