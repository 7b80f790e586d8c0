package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/streams"
)

// copyTable is the baseline table: streamd.events' columns, defaults, constraints and
// indexes (LIKE ... INCLUDING ALL), without its triggers.
var copyTable = pgx.Identifier{"streamd_bench", "events_copy"}

// copyColumns are the columns the baseline writes; the others stay NULL, as they do
// for the records streamd appends in the benchmark.
var copyColumns = []string{"stream_name", "partition", "offset", "event_id", "event_type", "key", "data", "timestamp", "version"}

// setupBaselineSchema (re)creates the baseline table from the current events table.
func setupBaselineSchema(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS streamd_bench;
		DROP TABLE IF EXISTS streamd_bench.events_copy;
		CREATE TABLE streamd_bench.events_copy (LIKE streamd.events INCLUDING ALL)`)
	if err != nil {
		return fmt.Errorf("create baseline table: %w", err)
	}
	return nil
}

// truncateCopy empties the baseline table the way dropStream empties a stream from
// streamd.events: DELETE, then VACUUM. TRUNCATE would hand COPY a fresh, empty file
// that every case must extend page by page (one extension lock for all writers),
// while streamd writes into space freed by earlier cases: the comparison would
// flatter streamd.
func truncateCopy(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, "DELETE FROM streamd_bench.events_copy"); err != nil {
		return fmt.Errorf("empty baseline table: %w", err)
	}
	if _, err := pool.Exec(ctx, "VACUUM streamd_bench.events_copy"); err != nil {
		return fmt.Errorf("vacuum baseline table: %w", err)
	}
	return nil
}

// dropStream deletes a benchmark stream and vacuums the events table, so that the
// next case starts from the same state (dead rows reusable, not bloating the heap).
func dropStream(ctx context.Context, env *Env, stream string) error {
	ctx = context.WithoutCancel(ctx)
	if err := env.Client.DeleteStream(ctx, stream); err != nil {
		return fmt.Errorf("clean up %s: %w", stream, err)
	}
	if _, err := env.Pool.Exec(ctx, "VACUUM streamd.events"); err != nil {
		return fmt.Errorf("vacuum events: %w", err)
	}
	return nil
}

// payloads returns n JSON objects of exactly size bytes each, with random letters
// (so that they do not compress better than real data would).
func payloads(size, n int) []json.RawMessage {
	r := rand.New(rand.NewPCG(uint64(size), 42))
	out := make([]json.RawMessage, n)
	for i := range out {
		head := fmt.Sprintf(`{"id":%d,"pad":"`, i)
		pad := max(size-len(head)-2, 0)
		b := make([]byte, 0, size)
		b = append(b, head...)
		for j := 0; j < pad; j++ {
			b = append(b, byte('a'+r.IntN(26)))
		}
		b = append(b, `"}`...)
		out[i] = b
	}
	return out
}

// rowSource makes the benchmark's rows: the same for streamd and for the baseline.
// Each worker has its own; it is not safe for concurrent use.
type rowSource struct {
	stream   string
	runID    string
	worker   int
	seq      int
	payloads []json.RawMessage
}

func newRowSource(env *Env, stream string, worker, payloadSize int) *rowSource {
	return &rowSource{stream: stream, runID: env.RunID, worker: worker, payloads: payloads(payloadSize, 64)}
}

// row is one benchmark record.
type row struct {
	eventID string
	key     string
	data    json.RawMessage
}

// next returns the worker's next row and its payload size (data plus key).
func (s *rowSource) next() (row, int) {
	s.seq++
	r := row{
		// UUID-shaped and unique per run and worker, like the ids producers send.
		eventID: fmt.Sprintf("%s-%04x-4000-8000-%012x", s.runID, s.worker&0xffff, s.seq),
		key:     fmt.Sprintf("user-%06d", (s.seq*7919+s.worker)%100000),
		data:    s.payloads[s.seq%len(s.payloads)],
	}
	return r, len(r.data) + len(r.key)
}

// records fills recs with n records for partition part (or for every partition in
// turn when part < 0) and returns them with their payload bytes.
func (s *rowSource) records(recs []streams.Record, n int, part int32, partitions int) ([]streams.Record, int) {
	recs = recs[:0]
	bytes := 0
	for i := 0; i < n; i++ {
		r, b := s.next()
		p := part
		if p < 0 {
			p = int32(i % partitions)
		}
		recs = append(recs, streams.Record{
			Stream: s.stream, Partition: streams.PartitionOf(p), Key: r.key,
			EventID: r.eventID, EventType: "bench", Data: r.data,
		})
		bytes += b
	}
	return recs, bytes
}

// copyRows fills out with n baseline rows for partition part, offsets from base.
func (s *rowSource) copyRows(out [][]any, n int, part int32, base int64, ts time.Time) ([][]any, int) {
	out = out[:0]
	bytes := 0
	for i := 0; i < n; i++ {
		r, b := s.next()
		out = append(out, []any{s.stream, part, base + int64(i), r.eventID, "bench", r.key, r.data, ts, int32(1)})
		bytes += b
	}
	return out, bytes
}

// copyBatch writes rows into the baseline table with one COPY (its own transaction).
func copyBatch(ctx context.Context, pool *pgxpool.Pool, rows [][]any) error {
	return copyBatchInto(ctx, pool, copyTable, rows)
}

// copyBatchInto writes rows into table with one COPY (its own transaction).
func copyBatchInto(ctx context.Context, pool *pgxpool.Pool, table pgx.Identifier, rows [][]any) error {
	n, err := pool.CopyFrom(ctx, table, copyColumns, pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("copy %d rows: %w", len(rows), err)
	}
	if int(n) != len(rows) {
		return fmt.Errorf("copy: %d of %d rows written", n, len(rows))
	}
	return nil
}
