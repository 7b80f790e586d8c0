package kafka

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// TestFirstPassReadsATopicInOneStatement: a fetch of several partitions of a topic
// that its connection has not seen with records to read reads them all, records and
// watermarks, in one statement: no head-row read before the reads (a round trip on
// every fetch's path), no read per partition. Partitions
// at their log end get their watermarks from it, one past its log end is
// OFFSET_OUT_OF_RANGE, one below its log start (DeleteRecords) too.
func TestFirstPassReadsATopicInOneStatement(t *testing.T) {
	t.Parallel()
	topic := testdb.Name("onestmt")
	log := &statementLog{stream: topic}
	pool := tracedPool(t, log)
	ts := startServer(t, pool, &Config{Wakeups: wakeup.NewHub()})
	tailsOff(ts) // the fetches' own reads, which the tail readers' would hide (tail_test.go)
	ctx := testCtx(t)
	sc := streams.NewClient(testdb.Pool(t), nil) // its statements are not logged
	require.NoError(t, sc.CreateStream(ctx, topic, 5))
	for _, p := range []int32{1, 3, 4} {
		_, err := sc.AppendPartition(ctx, topic, p, []streams.Record{{Bytes: []byte("a")}, {Bytes: []byte("b")}}, nil)
		require.NoError(t, err)
	}
	_, err := sc.DeleteBefore(ctx, topic, 4, 2)
	require.NoError(t, err)
	cl := newClient(t, []string{ts.addr})
	req := fetchReq(topic, 0, 0, 0, 1)
	for _, po := range [][2]int64{{1, 1}, {2, 5}, {3, 0}, {4, 1}} {
		addFetchPartition(req, int32(po[0]), po[1])
	}
	_, err = req.RequestWith(ctx, cl) // the topic's first fetch also reads its configuration
	require.NoError(t, err)
	log.take()

	// Another connection: this one's last answer said partitions 1 and 3 have records
	// at these offsets, which it reads on their own (TestBacklogIsReadOnItsOwn).
	resp, err := req.RequestWith(ctx, newClient(t, []string{ts.addr}))
	require.NoError(t, err)
	sqls, _ := log.take()
	require.Len(t, sqls, 1, "one statement for the topic (statements: %q)", sqls)
	require.Contains(t, sqls[0], "FROM streamd.events")
	ps := resp.Topics[0].Partitions
	require.Len(t, ps, 5)
	var codes []int16
	var hwms, starts []int64
	for _, p := range ps {
		codes, hwms, starts = append(codes, p.ErrorCode), append(hwms, p.HighWatermark), append(starts, p.LogStartOffset)
	}
	oor := kerr.OffsetOutOfRange.Code
	require.Equal(t, []int16{0, 0, oor, 0, oor}, codes)
	require.Equal(t, []int64{0, 2, 0, 2, 2}, hwms)
	require.Equal(t, []int64{0, 0, 0, 0, 2}, starts)
	require.Empty(t, ps[0].RecordBatches)
	require.NotEmpty(t, ps[1].RecordBatches)
	require.NotEmpty(t, ps[3].RecordBatches)
	var batch kmsg.RecordBatch
	require.NoError(t, batch.ReadFrom(ps[1].RecordBatches))
	require.Equal(t, int64(1), batch.FirstOffset, "partition 1 from the offset asked for")
	require.Equal(t, int32(1), batch.NumRecords)
	require.NoError(t, batch.ReadFrom(ps[3].RecordBatches))
	require.Equal(t, int32(2), batch.NumRecords)
	for _, q := range sqls {
		require.False(t, strings.Contains(q, "ORDER BY partition"), "no head-row read")
	}

	// TestBacklogIsReadOnItsOwn: on the first connection, whose last answer said
	// partitions 1 and 3 have records up to offset 2, those two are read on their own
	// (a backlog keeps its reads beside each other and the stash's pipelining), the
	// others in one statement; the answer is the same (min.bytes past what there is,
	// no wait: the pass answers when every read has ended).
	req.MinBytes = 1 << 20
	resp2, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	sqls, parts := log.take()
	var own []any
	multi := 0
	for i, q := range sqls {
		switch {
		case strings.Contains(q, "unnest"):
			multi++
		case strings.Contains(q, "FROM streamd.events"):
			own = append(own, parts[i])
		}
	}
	require.Equal(t, 1, multi, "statements: %q", sqls)
	require.ElementsMatch(t, []any{int32(1), int32(3)}, own, "statements: %q", sqls)
	for i, p := range resp2.Topics[0].Partitions {
		q := ps[i]
		require.Equal(t, []any{q.ErrorCode, q.HighWatermark, q.LogStartOffset, len(q.RecordBatches)},
			[]any{p.ErrorCode, p.HighWatermark, p.LogStartOffset, len(p.RecordBatches)}, "partition %d", p.Partition)
	}
}
