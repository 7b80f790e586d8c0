package kafka

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// One partition's bad input (FetchOffset -1) does not fail the other partitions of
// its topic read in the same statement: Kafka answers per partition (found in review:
// the one statement's bad input failed the whole topic).
func TestBadOffsetFailsOnlyItsPartition(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{Wakeups: wakeup.NewHub()})
	ctx := testCtx(t)
	topic := testdb.Name("badoff")
	sc := streams.NewClient(pool, nil)
	require.NoError(t, sc.CreateStream(ctx, topic, 2))
	_, err := sc.AppendPartition(ctx, topic, 1, []streams.Record{{Bytes: []byte("a")}}, nil)
	require.NoError(t, err)
	req := fetchReq(topic, 0, -1, 0, 1)
	addFetchPartition(req, 1, 0)
	resp, err := req.RequestWith(ctx, newClient(t, []string{ts.addr}))
	require.NoError(t, err)
	p1 := resp.Topics[0].Partitions[1]
	require.Zero(t, p1.ErrorCode, "partition 1 (offset 0, one record) answered with partition 0's error")
	require.NotEmpty(t, p1.RecordBatches)
}

// rowCounter counts the rows the fetch statements return.
type rowCounter struct {
	mu   sync.Mutex
	rows int64
}

type rcKey struct{}

func (r *rowCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	// Every read of events (the one statement, or fetchSQL).
	return context.WithValue(ctx, rcKey{}, strings.Contains(d.SQL, "SELECT * FROM streamd.events e"))
}

func (r *rowCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ok, _ := ctx.Value(rcKey{}).(bool); ok {
		r.mu.Lock()
		r.rows += d.CommandTag.RowsAffected()
		r.mu.Unlock()
	}
}

// A consumer's first fetch of a topic with a backlog on many partitions and a small
// fetch.max.bytes: what the server reads is bounded by fetch.max.bytes (and the
// connection's fetchParallelism reads), not partitions x that bound (found in
// review: the one statement read every partition up to its partition max bytes).
func TestFirstFetchReadsAboutFetchMaxBytes(t *testing.T) {
	t.Parallel()
	rc := &rowCounter{}
	pool := tracedPool(t, rc)
	ts := startServer(t, pool, &Config{Wakeups: wakeup.NewHub()})
	ctx := testCtx(t)
	topic := testdb.Name("fmaxb")
	sc := streams.NewClient(testdb.Pool(t), nil)
	const partitions, perPart, recBytes, maxBytes = 40, 50, 10 << 10, 100 << 10
	require.NoError(t, sc.CreateStream(ctx, topic, partitions))
	payload := make([]byte, recBytes)
	for i := range payload {
		payload[i] = byte(i*7919 + i>>8)
	}
	recs := make([]streams.Record, perPart)
	for i := range recs {
		recs[i] = streams.Record{Bytes: payload}
	}
	for p := int32(0); p < partitions; p++ {
		_, err := sc.AppendPartition(ctx, topic, p, recs, nil)
		require.NoError(t, err)
	}
	req := fetchReq(topic, 0, 0, 0, 1)
	req.MaxBytes = maxBytes
	for p := int32(1); p < partitions; p++ {
		addFetchPartition(req, p, 0)
	}
	resp, err := req.RequestWith(ctx, newClient(t, []string{ts.addr}))
	require.NoError(t, err)
	got := 0
	for _, p := range resp.Topics[0].Partitions {
		got += len(p.RecordBatches)
	}
	rc.mu.Lock()
	rows := rc.rows
	rc.mu.Unlock()
	t.Logf("response %d record bytes; the fetch statements returned %d rows (~%d KiB)", got, rows, rows*recBytes>>10)
	require.LessOrEqual(t, rows*recBytes, int64(fetchParallelism+1)*maxBytes+int64(partitions)*recBytes,
		"read %d rows for a %d-byte fetch.max.bytes", rows, maxBytes)
}

// A long-lived connection that fetches a topic, then (the topic deleted, or the
// partitions assigned elsewhere) fetches only another forgets the first topic's
// last-answered high watermarks: the map does not grow with every partition the
// connection ever fetched (found in review).
func TestLastAnswerForgetsPartitionsNoLongerFetched(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{Wakeups: wakeup.NewHub()})
	ctx := testCtx(t)
	sc := streams.NewClient(pool, nil)
	cl := newClient(t, []string{ts.addr})
	var last string
	for i := 0; i < 20; i++ {
		topic := testdb.Name("lasthw")
		require.NoError(t, sc.CreateStream(ctx, topic, 3))
		req := fetchReq(topic, 0, 0, 0, 1)
		for p := int32(1); p < 3; p++ {
			addFetchPartition(req, p, 0)
		}
		_, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		last = topic
	}
	ts.srv.mu.Lock()
	defer ts.srv.mu.Unlock()
	for c := range ts.srv.conns {
		_, hw := c.stash.snapshot()
		for k := range hw {
			require.Equal(t, last, k.topic, "%d entries kept on a connection whose last fetch named 3 partitions", len(hw))
		}
	}
}
