package advisory_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/advisory"
	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/tailer"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/internal/testmetrics"
	"github.com/streamd/streamd/messages"
	"github.com/streamd/streamd/retention"
	"github.com/streamd/streamd/streams"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// head is the advisory stream's log end now: the tests look only at what comes after.
func head(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT next_offset FROM streamd.stream_partitions WHERE stream_name = $1 AND partition = 0", advisory.Stream).Scan(&n))
	return n
}

// advisories fetches (through the ordinary read path) the advisories of type typ and
// key key appended at or after from.
func advisories(t *testing.T, pool *pgxpool.Pool, from int64, typ, key string) []streams.Event {
	t.Helper()
	var out []streams.Event
	for {
		res, err := streams.FetchTx(context.Background(), pool, advisory.Stream, 0, from, &streams.FetchOpts{MaxRecords: 1000})
		require.NoError(t, err)
		for _, e := range res.Events {
			if e.EventType == typ && e.Key == key {
				out = append(out, e)
			}
		}
		if len(res.Events) == 0 {
			return out
		}
		from = res.NextOffset
	}
}

// await waits until an advisory of type typ and key key, appended at or after from,
// decodes to a T for which match holds, and returns it.
func await[T any](t *testing.T, pool *pgxpool.Pool, from int64, typ, key string, match func(*T) bool) *T {
	t.Helper()
	var found *T
	testdb.WaitFor(t, 30*time.Second, typ+" for "+key, func() bool {
		for _, e := range advisories(t, pool, from, typ, key) {
			v, err := advisory.Decode(e.EventType, e.Data)
			require.NoError(t, err)
			p, ok := v.(*T)
			require.True(t, ok, "%s decodes to %T", typ, v)
			if match == nil || match(p) {
				found = p
				return true
			}
		}
		return false
	})
	return found
}

func newStream(t *testing.T, pool *pgxpool.Pool, partitions int32) string {
	t.Helper()
	name := testdb.Name("adv")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(context.Background(), name, partitions))
	return name
}

func produce(t *testing.T, pool *pgxpool.Pool, stream string, n int) {
	t.Helper()
	recs := make([]streams.Record, n)
	for i := range recs {
		recs[i] = streams.Record{Stream: stream, Key: fmt.Sprint("k", i), Data: json.RawMessage(fmt.Sprint(i))}
	}
	_, err := streams.NewClient(pool, nil).Produce(context.Background(), recs...)
	require.NoError(t, err)
}

func groupConfig(stream, group string) *consumergroup.Config {
	return &consumergroup.Config{
		Stream: stream, Group: group, SessionTimeout: 1500 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond,
		FetchMaxWait: 100 * time.Millisecond, RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond,
		Logger: quiet(), MaxBatchSize: 20,
	}
}

// run runs c until the test ends.
func run(t *testing.T, c *consumergroup.Consumer, h consumergroup.Handler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h) }() // owner: this test; ends at cleanup
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("Run did not return within 15s")
		}
	})
}

// TestGroupDeadLetterAdvisory: a real consumer's handler gives up on an event; the
// advisory names the event's provenance and its dead letter, and a consumer group
// reading streamd.advisories receives it.
func TestGroupDeadLetterAdvisory(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	from := head(t, pool)
	stream := newStream(t, pool, 1)
	group := testdb.Name("g")
	produce(t, pool, stream, 3)
	cfg := groupConfig(stream, group)
	cfg.OnHandlerError = consumergroup.ErrorDeadLetter
	cfg.MaxRetries = consumergroup.NoRetries
	c, err := consumergroup.New(pool, cfg)
	require.NoError(t, err)
	run(t, c, func(ctx context.Context, b *consumergroup.Batch) error {
		for _, e := range b.Events {
			if e.Offset == 1 {
				return errors.New("poison at 1")
			}
		}
		return nil
	})
	a := await[advisory.GroupDeadLettered](t, pool, from, advisory.TypeGroupDeadLettered, stream+"/"+group, nil)
	require.Equal(t, stream, a.Stream)
	require.Equal(t, group, a.Group)
	require.Equal(t, int64(1), a.Offset)
	require.Contains(t, a.Error, "poison at 1")
	require.NotEmpty(t, a.EventID)
	require.NotEmpty(t, a.Member)
	dl, err := consumergroup.NewAdmin(pool).DeadLetters(context.Background(), stream, group, "pending")
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.Equal(t, dl[0].ID, a.DeadLetterID)

	// Any group can read the advisory stream: one reading from where this test
	// began gets the advisory.
	reader := groupConfig(advisory.Stream, testdb.Name("reader"))
	reader.AutoOffsetReset = consumergroup.ResetEarliest
	rc, err := consumergroup.New(pool, reader)
	require.NoError(t, err)
	got := make(chan struct{})
	var once sync.Once
	run(t, rc, func(ctx context.Context, b *consumergroup.Batch) error {
		for _, e := range b.Events {
			if e.EventType == advisory.TypeGroupDeadLettered && e.Key == stream+"/"+group {
				once.Do(func() { close(got) })
			}
		}
		return nil
	})
	select {
	case <-got:
	case <-time.After(60 * time.Second):
		t.Fatal("a consumer group of streamd.advisories did not receive the advisory")
	}
}

// TestQueueDeadLetterAdvisory: a message that runs out of delivery attempts moves to
// its dead-letter queue, and the advisory says where from and where to.
func TestQueueDeadLetterAdvisory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	from := head(t, pool)
	qc, err := messages.NewClient(pool, &messages.ClientConfig{Logger: quiet()})
	require.NoError(t, err)
	q, dlq := testdb.Name("q"), testdb.Name("dlq")
	require.NoError(t, qc.CreateQueue(ctx, dlq, nil))
	require.NoError(t, qc.CreateQueue(ctx, q, &messages.QueueConfig{MaxDeliveryAttempts: 1, DeadLetterQueue: dlq}))
	sent, err := qc.Send(ctx, q, messages.OutgoingMessage{MessageID: "m-1", Data: json.RawMessage(`{"n": 1}`)})
	require.NoError(t, err)
	got, err := qc.Receive(ctx, q, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.NoError(t, qc.Nack(ctx, &messages.NackOpts{Error: "cannot parse"}, got[0].Receipt))

	a := await[advisory.QueueDeadLettered](t, pool, from, advisory.TypeQueueDeadLettered, q, nil)
	require.Equal(t, q, a.Queue)
	require.Equal(t, dlq, a.DeadLetterQueue)
	require.Equal(t, "m-1", a.MessageID)
	require.Equal(t, sent[0].Offset, a.OriginOffset)
	require.Equal(t, 1, a.Attempts)
	require.Equal(t, "cannot parse", a.Error)
	peek, err := qc.Peek(ctx, dlq, nil)
	require.NoError(t, err)
	require.Len(t, peek, 1)
	require.Equal(t, peek[0].Offset, a.DeadLetterOffset)
}

// TestMemberExpiredAndRebalancedAdvisories: a member that stops heartbeating (a
// process that died: joined, then nothing) is expired by a real consumer joining the
// group after its session timeout, which reports the expiry (with the partitions the
// dead member owned) and the rebalance that gives the live consumer every partition.
func TestMemberExpiredAndRebalancedAdvisories(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	from := head(t, pool)
	stream := newStream(t, pool, 4)
	group := testdb.Name("g")
	key := stream + "/" + group
	var dead string
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.join_group($1, $2, 'dead-member', NULL, 200, 200, NULL)",
		stream, group).Scan(new(int64)))
	dead = "dead-member"
	first := await[advisory.Rebalanced](t, pool, from, advisory.TypeRebalanced, key, nil)
	require.Len(t, first.Members, 1)
	require.Equal(t, []int32{0, 1, 2, 3}, first.Members[0].Owns, "the only member gets every partition")

	mid := head(t, pool)
	c, err := consumergroup.New(pool, groupConfig(stream, group))
	require.NoError(t, err)
	run(t, c, func(context.Context, *consumergroup.Batch) error { return nil })

	gone := await[advisory.MemberGone](t, pool, mid, advisory.TypeMemberExpired, key, nil)
	require.Equal(t, dead, gone.Member)
	require.Equal(t, "session_timeout", gone.Reason)
	require.Equal(t, []int32{0, 1, 2, 3}, gone.Partitions)
	require.Equal(t, int64(200), gone.SessionTimeoutMS)
	reb := await[advisory.Rebalanced](t, pool, mid, advisory.TypeRebalanced, key, func(r *advisory.Rebalanced) bool {
		return len(r.Members) == 1 && len(r.Members[0].Owns) == 4
	})
	require.NotEqual(t, dead, reb.Members[0].Member)
	require.Empty(t, reb.Unowned)
}

// TestMemberFencedAndOffsetsResetAdvisories: a forced offset reset expels the live
// member (fenced, reason offsets_reset) and reports the reset with each partition's
// previous and new offset; a restart under the same instance id fences the previous
// member (instance_replaced).
func TestMemberFencedAndOffsetsResetAdvisories(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	from := head(t, pool)
	stream := newStream(t, pool, 1)
	produce(t, pool, stream, 5)
	group := testdb.Name("g")
	key := stream + "/" + group
	var epoch int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.join_group($1, $2, 'm1', 'instance-a', 60000, 60000, NULL)",
		stream, group).Scan(&epoch))
	_, err := pool.Exec(ctx, "SELECT streamd.commit_offsets($1, $2, 'm1', $3, ARRAY[0], ARRAY[3::bigint], NULL, NULL)", stream, group, epoch)
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.join_group($1, $2, 'm2', 'instance-a', 60000, 60000, NULL)",
		stream, group).Scan(&epoch))
	replaced := await[advisory.MemberGone](t, pool, from, advisory.TypeMemberFenced, key, nil)
	require.Equal(t, "m1", replaced.Member)
	require.Equal(t, "instance_replaced", replaced.Reason)
	require.Equal(t, "instance-a", replaced.InstanceID)

	mid := head(t, pool)
	_, err = consumergroup.NewAdmin(pool).ResetOffsets(ctx, stream, group,
		consumergroup.ResetOpts{Mode: consumergroup.ResetToEarliest, Force: true})
	require.NoError(t, err)
	fenced := await[advisory.MemberGone](t, pool, mid, advisory.TypeMemberFenced, key, nil)
	require.Equal(t, "m2", fenced.Member)
	require.Equal(t, "offsets_reset", fenced.Reason)
	reset := await[advisory.OffsetsReset](t, pool, mid, advisory.TypeOffsetsReset, key, nil)
	require.Equal(t, "earliest", reset.Mode)
	require.True(t, reset.Forced)
	require.Len(t, reset.Partitions, 1)
	require.Equal(t, int64(3), *reset.Partitions[0].PreviousOffset)
	require.Equal(t, int64(0), reset.Partitions[0].NewOffset)

	// A dry run reports nothing: it was rolled back.
	mid = head(t, pool)
	_, err = consumergroup.NewAdmin(pool).ResetOffsets(ctx, stream, group,
		consumergroup.ResetOpts{Mode: consumergroup.ResetToLatest, DryRun: true})
	require.NoError(t, err)
	require.Empty(t, advisories(t, pool, mid, advisory.TypeOffsetsReset, key))
}

// TestUnreadDeletedAdvisory: retention that moves the log start past the committed
// offset of a live group reports the group and how many unread events went, by both
// retention paths (the seed's one-transaction function and the Go runner's bounded
// steps); a group that had read everything deleted is not named.
func TestUnreadDeletedAdvisory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	from := head(t, pool)
	stream := newStream(t, pool, 1)
	produce(t, pool, stream, 10)
	behind, ahead := testdb.Name("behind"), testdb.Name("ahead")
	for g, off := range map[string]int64{behind: 2, ahead: 9} {
		var epoch int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT streamd.join_group($1, $2, 'm', NULL, 600000, 600000, NULL)",
			stream, g).Scan(&epoch))
		_, err := pool.Exec(ctx, "SELECT streamd.commit_offsets($1, $2, 'm', $3, ARRAY[0], ARRAY[$4::bigint], NULL, NULL)",
			stream, g, epoch, off)
		require.NoError(t, err)
	}
	// Keep the last 5 of 10: the log start goes from 0 to 5.
	_, err := pool.Exec(ctx, "SELECT streamd.apply_size_retention($1, 5)", stream)
	require.NoError(t, err)
	a := await[advisory.UnreadDeleted](t, pool, from, advisory.TypeUnreadDeleted, stream, nil)
	require.Equal(t, int64(0), a.PreviousLogStartOffset)
	require.Equal(t, int64(5), a.LogStartOffset)
	require.Equal(t, []advisory.UnreadGroup{{Group: behind, CommittedOffset: 2, UnreadDeleted: 3}}, a.Groups)

	// The Go runner (retention_advance, then bounded deletes): keep the last 2.
	mid := head(t, pool)
	_, err = pool.Exec(ctx, "INSERT INTO streamd.retention_policies (stream_name, max_event_count) VALUES ($1, 2)", stream)
	require.NoError(t, err)
	r, err := retention.New(pool, &retention.Config{Logger: quiet()})
	require.NoError(t, err)
	_, err = r.Apply(ctx, stream, nil)
	require.NoError(t, err)
	a = await[advisory.UnreadDeleted](t, pool, mid, advisory.TypeUnreadDeleted, stream, nil)
	require.Equal(t, int64(5), a.PreviousLogStartOffset)
	require.Equal(t, int64(8), a.LogStartOffset)
	require.Equal(t, []advisory.UnreadGroup{{Group: behind, CommittedOffset: 2, UnreadDeleted: 3}}, a.Groups,
		"3 more unread events of the group went (5, 6, 7); the one at 9 read them all")
}

// withUser returns connection string base for role user.
func withUser(t *testing.T, base, user string) string {
	t.Helper()
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		u, err := url.Parse(base)
		require.NoError(t, err)
		u.User = url.User(user)
		return u.String()
	}
	return base + " user=" + user
}

// TestTailerAdvisories: a tailer whose role may not replicate falls back to polling
// and says so on the advisory stream (once, not per retry); a streaming tailer whose
// replication connection is killed (its temporary slot goes with it) reports the
// loss. Neither waits for the write: the publisher's goroutine makes it.
func TestTailerAdvisories(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	from := head(t, pool)
	pub, err := advisory.New(pool, &advisory.Config{Logger: quiet()})
	require.NoError(t, err)
	pctx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan error, 1)
	go func() { pubDone <- pub.Run(pctx) }() // owner: this test
	defer func() { stopPub(); require.NoError(t, <-pubDone) }()

	role := strings.ReplaceAll(testdb.Name("streamd_norepl"), "-", "_")
	_, err = pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN NOREPLICATION NOSUPERUSER")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize()) })

	runTailer := func(name, conn string) (*tailer.Tailer, func()) {
		tl, err := tailer.New(&tailer.Config{Advisories: pub, ApplicationName: name, ConnString: conn,
			Handler: func(context.Context, tailer.Event) {}, Logger: quiet(),
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, UnsupportedRetry: 20 * time.Millisecond})
		require.NoError(t, err)
		tctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- tl.Run(tctx) }() // owner: this test, through the returned stop
		return tl, func() { cancel(); require.NoError(t, <-done) }
	}

	norepl := testdb.Name("tailer-norepl")
	tl, stop := runTailer(norepl, withUser(t, testdb.URL(t), role))
	testdb.WaitFor(t, 20*time.Second, "state unsupported", func() bool { return tl.State() == tailer.StateUnsupported })
	a := await[advisory.Tailer](t, pool, from, advisory.TypeTailerPolling, norepl, nil)
	require.Equal(t, tailer.ReasonPrivilege, a.Reason)
	require.Equal(t, norepl, a.Tailer)
	// It retried every 20ms meanwhile; the advisory is said once per change of cause.
	stop()
	require.Len(t, advisories(t, pool, from, advisory.TypeTailerPolling, norepl), 1)

	streaming := testdb.Name("tailer-kill")
	tl, stop = runTailer(streaming, testdb.URL(t))
	defer stop()
	testdb.WaitFor(t, 90*time.Second, "streaming", func() bool { return tl.State() == tailer.StateStreaming })
	var killed bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT bool_or(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
		streaming).Scan(&killed))
	require.True(t, killed)
	lost := await[advisory.Tailer](t, pool, from, advisory.TypeTailerSlotLost, streaming, nil)
	require.Equal(t, streaming, lost.Tailer)
	require.NotEmpty(t, lost.Error)
}

// TestPublisherNeverBlocks: with its buffer full (no Run), Publish returns at once,
// drops and counts; a nil Publisher publishes nothing.
func TestPublisherNeverBlocks(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	pub, err := advisory.New(testdb.Pool(t), &advisory.Config{Buffer: 1, Logger: quiet(), Registerer: reg})
	require.NoError(t, err)
	a := advisory.Advisory{Type: advisory.TypeTailerPolling, Key: "x", Data: advisory.Tailer{Tailer: "x"}}
	require.True(t, pub.Publish(a))
	require.False(t, pub.Publish(a))
	require.False(t, pub.Publish(a))
	require.Equal(t, 2.0, testmetrics.Value(t, reg, "streamd_advisory_dropped_total", "reason", "full"))
	var none *advisory.Publisher
	require.False(t, none.Publish(a))
	_, err = advisory.New(testdb.Pool(t), &advisory.Config{Buffer: -1})
	require.ErrorContains(t, err, "Config.Buffer")
}

// TestAdvisoryStreamExists: the migration made the stream, with one partition and a
// retention policy of 7 days whose JSON face matches it.
func TestAdvisoryStreamExists(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	var partitions int32
	var maxAge int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT s.partitions, p.max_age_seconds FROM streamd.streams s
		JOIN streamd.retention_policies p USING (stream_name) WHERE s.stream_name = $1`, advisory.Stream).Scan(&partitions, &maxAge))
	require.Equal(t, int32(1), partitions)
	require.Equal(t, int64(7*24*3600), maxAge)
	var cfg []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT retention_config FROM streamd.stream_configurations WHERE stream_name = $1`,
		advisory.Stream).Scan(&cfg))
	require.JSONEq(t, `{"enabled": true, "maxAge": "7.00:00:00", "cleanupPolicy": "delete",
		"tombstoneRetention": "1.00:00:00", "protectConsumers": false}`, string(cfg))
}
