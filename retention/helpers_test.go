package retention_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/retention"
	"github.com/streamd/streamd/streams"
)

type fixture struct {
	t      *testing.T
	ctx    context.Context
	pool   *pgxpool.Pool
	client *streams.Client
	stream string
	runner *retention.Runner
}

// setup creates a stream with the given partitions and a runner limited to it.
func setup(t *testing.T, partitions int32) *fixture {
	t.Helper()
	pool := testdb.Pool(t)
	c := streams.NewClient(pool, nil)
	name := testdb.Name("ret")
	ctx := context.Background()
	require.NoError(t, c.CreateStream(ctx, name, partitions))
	r, err := retention.New(pool, &retention.Config{BatchSize: 7, Interval: 10 * time.Millisecond, Streams: []string{name}})
	require.NoError(t, err)
	return &fixture{t: t, ctx: ctx, pool: pool, client: c, stream: name, runner: r}
}

// produce appends n JSON events to partition p and returns their positions.
func (f *fixture) produce(p int32, n int) []streams.Position {
	f.t.Helper()
	recs := make([]streams.Record, n)
	for i := range recs {
		recs[i] = streams.Record{Stream: f.stream, Partition: streams.PartitionOf(p), Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	pos, err := f.client.Produce(f.ctx, recs...)
	require.NoError(f.t, err)
	return pos
}

// backdate appends one event per timestamp to partition p with that timestamp (the
// trusted path of streamd.append, as if the events had been appended back then).
// Timestamps must be ascending and older than anything in the partition.
func (f *fixture) backdate(p int32, ts []time.Time) {
	f.t.Helper()
	tx, err := f.pool.Begin(f.ctx)
	require.NoError(f.t, err)
	defer tx.Rollback(f.ctx)
	var next int64
	require.NoError(f.t, tx.QueryRow(f.ctx, `UPDATE streamd.stream_partitions SET next_offset = next_offset + $3,
		last_appended_at = greatest(last_appended_at, $4) WHERE stream_name = $1 AND partition = $2
		RETURNING next_offset - $3`, f.stream, p, len(ts), ts[len(ts)-1]).Scan(&next))
	_, err = tx.Exec(f.ctx, "SELECT set_config('streamd.append_trusted', 'on', true)")
	require.NoError(f.t, err)
	_, err = tx.Exec(f.ctx, `INSERT INTO streamd.events (stream_name, partition, "offset", data, "timestamp")
		SELECT $1, $2, $3 + o - 1, jsonb_build_object('o', $3 + o - 1), t FROM unnest($4::timestamptz[]) WITH ORDINALITY AS u(t, o)`,
		f.stream, p, next, ts)
	require.NoError(f.t, err)
	_, err = tx.Exec(f.ctx, "SELECT set_config('streamd.append_trusted', 'off', true)")
	require.NoError(f.t, err)
	require.NoError(f.t, tx.Commit(f.ctx))
}

// policy writes the stream's retention policy the seed's way (SQL on retention_policies).
func (f *fixture) policy(sets string, args ...any) {
	f.t.Helper()
	_, err := f.pool.Exec(f.ctx, `INSERT INTO streamd.retention_policies (stream_name) VALUES ($1) ON CONFLICT DO NOTHING`, f.stream)
	require.NoError(f.t, err)
	_, err = f.pool.Exec(f.ctx, `UPDATE streamd.retention_policies SET `+sets+` WHERE stream_name = $1`, append([]any{f.stream}, args...)...)
	require.NoError(f.t, err)
}

// stored returns the stored offsets of partition p, ascending.
func (f *fixture) stored(p int32) []int64 {
	f.t.Helper()
	rows, err := f.pool.Query(f.ctx, `SELECT "offset" FROM streamd.events WHERE stream_name = $1 AND partition = $2 ORDER BY "offset"`, f.stream, p)
	require.NoError(f.t, err)
	var out []int64
	for rows.Next() {
		var o int64
		require.NoError(f.t, rows.Scan(&o))
		out = append(out, o)
	}
	require.NoError(f.t, rows.Err())
	return out
}

// head returns partition p's log start and log end.
func (f *fixture) head(p int32) (start, end int64) {
	f.t.Helper()
	require.NoError(f.t, f.pool.QueryRow(f.ctx, `SELECT log_start_offset, next_offset FROM streamd.stream_partitions
		WHERE stream_name = $1 AND partition = $2`, f.stream, p).Scan(&start, &end))
	return start, end
}

// group registers group with one member whose last heartbeat was at hb (session 60s)
// and commits offset on partition p, the way consumergroup stores them.
func (f *fixture) group(group string, p int32, offset int64, hb time.Time) {
	f.t.Helper()
	_, err := f.pool.Exec(f.ctx, `INSERT INTO streamd.consumer_groups (stream_name, group_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, f.stream, group)
	require.NoError(f.t, err)
	_, err = f.pool.Exec(f.ctx, `INSERT INTO streamd.consumer_registrations (stream_name, group_id, consumer_id, last_heartbeat, session_timeout_ms, member_epoch)
		VALUES ($1, $2, 'm1', $3, 60000, 1)
		ON CONFLICT (stream_name, group_id, consumer_id) DO UPDATE SET last_heartbeat = EXCLUDED.last_heartbeat`, f.stream, group, hb)
	require.NoError(f.t, err)
	f.commit(group, p, offset)
}

func (f *fixture) commit(group string, p int32, offset int64) {
	f.t.Helper()
	_, err := f.pool.Exec(f.ctx, `INSERT INTO streamd.consumer_offsets (stream_name, group_id, partition, "offset", committed_by, member_epoch)
		VALUES ($1, $2, $3, $4, 'm1', 1) ON CONFLICT (stream_name, group_id, partition) DO UPDATE SET "offset" = EXCLUDED."offset"`,
		f.stream, group, p, offset)
	require.NoError(f.t, err)
}

func seq(from, to int64) []int64 {
	var out []int64
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}
