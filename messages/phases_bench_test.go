package messages_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/queuebaseline"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// BenchmarkQueuePhases takes BenchmarkQueueThroughput's gap apart: on one connection,
// no concurrency, each iteration sends benchBatch messages, receives them and acks
// them, phase by phase, for four systems in the same run:
//   - raw: the raw SKIP LOCKED queue (its "receive" is the drain, it has no ack);
//   - pgmq: pgmq's batched read (UPDATE ... SKIP LOCKED RETURNING) and delete;
//   - streamd: Client.Send, Client.Receive (Max benchBatch), Client.Ack;
//   - lean: the leanest statements that keep streamd's lease on seed 003's columns,
//     on a table of its own with those ten columns (plus the lease token and the
//     columns the statements set, not_before and dedup; session 5 copied streamd's
//     whole row of the time) and only the primary key: a bare
//     INSERT (no returned offsets), the HOT lease UPDATE by ctid of rows locked
//     with SKIP LOCKED in offset order, the DELETE by offset and lease token. No
//     function, no validation, no ready index (delayed and in-flight messages are
//     read past), no tenant, no dedup: what any layout keeping those columns and a
//     per-message lease pays at least.
//
// It reports each system's median time per batch for each phase, and its messages/s
// as a ratio to the raw queue's (the ratio of BenchmarkQueueThroughput's target).
//
// When the database runs on this machine (the local cluster), it also reports the
// server's CPU time per batch and phase (the backend's run time from
// /proc/<pid>/schedstat, in ns, read around each phase; the mean over the
// iterations), and streamd's total as a multiple of pgmq's: on the shared 2-core VM,
// wall times move by ±30% between identical runs, the backend's CPU time much less.
// streamd's Client runs on a pool of one connection for this, the baselines on one
// connection of their own.
func BenchmarkQueuePhases(b *testing.B) {
	ctx := context.Background()
	pool, _, q := benchQueue(b, "phases")
	cfg := testdb.Config(b)
	cfg.MaxConns = 1
	cpool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	defer cpool.Close()
	c, err := messages.NewClient(cpool, nil)
	require.NoError(b, err)
	raw := pgx.Identifier{strings.ReplaceAll(testdb.Name("phases_raw"), "-", "_")}.Sanitize()
	pgmq := pgx.Identifier{strings.ReplaceAll(testdb.Name("phases_pgmq"), "-", "_")}.Sanitize()
	lean := pgx.Identifier{strings.ReplaceAll(testdb.Name("phases_lean"), "-", "_")}.Sanitize()
	_, err = pool.Exec(ctx, fmt.Sprintf(queuebaseline.RawTable, raw)+";"+fmt.Sprintf(queuebaseline.PgmqTable, pgmq)+";"+
		fmt.Sprintf(`CREATE TABLE %s (stream_name text NOT NULL, "offset" bigserial NOT NULL, message_id text NOT NULL,
		 data jsonb, metadata jsonb, enqueued_at timestamptz NOT NULL DEFAULT now(),
		 visibility_timeout timestamptz NOT NULL DEFAULT now(), delivery_attempts integer NOT NULL DEFAULT 0,
		 max_delivery_attempts integer, dead_letter_stream text, lease_token uuid, not_before timestamptz, dedup boolean,
		 PRIMARY KEY (stream_name, "offset")) WITH (fillfactor = 50)`, lean))
	require.NoError(b, err)
	defer func() { _, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+raw+", "+pgmq+", "+lean) }()
	conn, err := pool.Acquire(ctx) // the baselines' one connection; the Client has its own
	require.NoError(b, err)
	defer conn.Release()
	backendCPU := func(db interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) func() (time.Duration, bool) {
		var pid int
		require.NoError(b, db.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
		path := fmt.Sprintf("/proc/%d/schedstat", pid)
		return func() (time.Duration, bool) {
			bs, err := os.ReadFile(path)
			var ns int64
			if err != nil {
				return 0, false
			}
			if _, err := fmt.Sscan(string(bs), &ns); err != nil {
				return 0, false
			}
			return time.Duration(ns), true
		}
	}
	baselineCPU, clientCPU := backendCPU(conn), backendCPU(cpool)

	payloads := make([]string, benchBatch)
	msgs := make([]messages.OutgoingMessage, benchBatch)
	for i := range payloads {
		payloads[i] = fmt.Sprintf(`{"order":%d,"customer":"c-%d","amount":%d.5}`, i, i%97, i)
		msgs[i] = messages.OutgoingMessage{Data: json.RawMessage(payloads[i])}
	}
	// Each system: send, receive (returns what ack needs), ack.
	type system struct {
		name    string
		send    func() error
		receive func() (any, int, error)
		ack     func(any) error
		cpu     func() (time.Duration, bool) // its backend's CPU time so far
	}
	scanIDs := func(rows pgx.Rows, err error) ([]int64, int, error) {
		if err != nil {
			return nil, 0, err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			var p []byte
			if err := rows.Scan(&id, &p); err != nil {
				return nil, 0, err
			}
			ids = append(ids, id)
		}
		return ids, len(ids), rows.Err()
	}
	systems := []system{
		{"raw",
			func() error { return queuebaseline.Send(ctx, conn, queuebaseline.RawSend, raw, payloads) },
			func() (any, int, error) {
				n, _, err := queuebaseline.DrainRaw(ctx, conn, raw, benchBatch)
				return nil, n, err
			},
			func(any) error { return nil }, baselineCPU},
		{"pgmq",
			func() error { return queuebaseline.Send(ctx, conn, queuebaseline.PgmqSend, pgmq, payloads) },
			func() (any, int, error) {
				ids, n, err := scanIDs(conn.Query(ctx, fmt.Sprintf(queuebaseline.PgmqRead, pgmq), benchBatch))
				return ids, n, err
			},
			func(ids any) error {
				_, err := conn.Exec(ctx, fmt.Sprintf(queuebaseline.PgmqDelete, pgmq), ids)
				return err
			}, baselineCPU},
		{"streamd",
			func() error { _, err := c.Send(ctx, q, msgs...); return err },
			func() (any, int, error) {
				got, err := c.Receive(ctx, q, &messages.ReceiveOpts{Max: benchBatch})
				rs := make([]messages.Receipt, len(got))
				for i, m := range got {
					rs[i] = m.Receipt
				}
				return rs, len(got), err
			},
			func(rs any) error { return c.Ack(ctx, rs.([]messages.Receipt)...) }, clientCPU},
		{"lean",
			func() error {
				ids := make([]string, benchBatch)
				for i := range ids {
					ids[i] = uuid.NewString()
				}
				_, err := conn.Exec(ctx, `INSERT INTO `+lean+` (stream_name, message_id, data, enqueued_at, visibility_timeout,
					not_before, max_delivery_attempts, dedup)
					SELECT $1, u.id, u.d::jsonb, now(), now(), now(), 5, false FROM unnest($2::text[], $3::text[]) u(id, d)`,
					q, ids, payloads)
				return err
			},
			func() (any, int, error) {
				rows, err := conn.Query(ctx, `UPDATE `+lean+` m SET delivery_attempts = m.delivery_attempts + 1,
					lease_token = gen_random_uuid(), visibility_timeout = now() + interval '30 seconds'
					WHERE m.ctid = ANY(ARRAY(SELECT x.ctid FROM `+lean+` x WHERE x.stream_name = $1 AND x.not_before <= now()
					    AND x.visibility_timeout <= now() ORDER BY x."offset" LIMIT $2 FOR UPDATE SKIP LOCKED))
					RETURNING m."offset", m.message_id, m.data, m.metadata, m.enqueued_at, m.visibility_timeout,
					    m.delivery_attempts, m.max_delivery_attempts, m.lease_token`, q, benchBatch)
				if err != nil {
					return nil, 0, err
				}
				var offs []int64
				var toks [][16]byte
				for rows.Next() {
					var o int64
					var id string
					var d, md []byte
					var e, v time.Time
					var a, ma int32
					var t [16]byte
					if err := rows.Scan(&o, &id, &d, &md, &e, &v, &a, &ma, &t); err != nil {
						return nil, 0, err
					}
					offs, toks = append(offs, o), append(toks, t)
				}
				return [2]any{offs, toks}, len(offs), rows.Err()
			},
			func(r any) error {
				a := r.([2]any)
				_, err := conn.Exec(ctx, `DELETE FROM `+lean+` m WHERE m.stream_name = $1 AND m."offset" = ANY($2)
					AND m.lease_token = ANY($3)`, q, a[0], a[1])
				return err
			}, baselineCPU},
	}
	phases := [3]string{"send", "receive", "ack"}
	times := make([][3][]time.Duration, len(systems))
	cpus := make([][3]time.Duration, len(systems)) // summed over the iterations
	_, cpuOK := clientCPU()
	iterations := 0
	for i := 0; b.Loop(); i++ {
		iterations++
		for j := range systems {
			k := (i + j) % len(systems) // rotating order
			s := systems[k]
			c0, _ := s.cpu()
			t0 := time.Now()
			require.NoError(b, s.send())
			t1 := time.Now()
			c1, _ := s.cpu()
			r, n, err := s.receive()
			require.NoError(b, err)
			require.Equal(b, benchBatch, n, s.name)
			t2 := time.Now()
			c2, _ := s.cpu()
			require.NoError(b, s.ack(r))
			t3 := time.Now()
			c3, _ := s.cpu()
			times[k][0] = append(times[k][0], t1.Sub(t0))
			times[k][1] = append(times[k][1], t2.Sub(t1))
			times[k][2] = append(times[k][2], t3.Sub(t2))
			cpus[k][0] += c1 - c0
			cpus[k][1] += c2 - c1
			cpus[k][2] += c3 - c2
		}
		if i%50 == 49 { // outside the timing, as autovacuum would
			b.StopTimer()
			_, err := pool.Exec(ctx, "VACUUM "+raw+", "+pgmq+", "+lean+", streamd.queue_messages")
			require.NoError(b, err)
			b.StartTimer()
		}
	}
	median := func(d []time.Duration) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	var rawTotal time.Duration
	for k, s := range systems {
		var total time.Duration
		for p := range phases {
			m := median(times[k][p])
			total += m
			if s.name != "raw" || p < 2 {
				b.ReportMetric(float64(m.Microseconds()), s.name+"_"+phases[p]+"_µs/batch")
			}
		}
		if k == 0 {
			rawTotal = total
		} else {
			b.ReportMetric(rawTotal.Seconds()/total.Seconds(), s.name+"/raw")
		}
	}
	if !cpuOK {
		return // the database is not on this machine
	}
	cpuTotal := make([]time.Duration, len(systems))
	for k, s := range systems {
		for p := range phases {
			cpuTotal[k] += cpus[k][p]
			if s.name != "raw" || p < 2 {
				b.ReportMetric(float64(cpus[k][p].Microseconds())/float64(iterations), s.name+"_"+phases[p]+"_server_cpu_µs/batch")
			}
		}
	}
	for k, s := range systems {
		if s.name == "streamd" {
			for j, t := range systems {
				if t.name == "pgmq" {
					b.ReportMetric(cpuTotal[k].Seconds()/cpuTotal[j].Seconds(), "streamd_server_cpu/pgmq")
				}
			}
		}
	}
}
