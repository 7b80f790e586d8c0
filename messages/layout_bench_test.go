package messages

// This file is in package messages, not messages_test: the bare systems below do the
// client's work of Client.Send, Receive and Ack with the Client's own code (freshIDs,
// the validation, scanMessage, readAck), so that what differs between them and
// streamd is the SQL and the table, not the Go around it.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/pgtext"
	"github.com/streamd/streamd/internal/queuebaseline"
	"github.com/streamd/streamd/internal/testdb"
)

// BenchmarkQueueLayouts measures the ceiling of each storage layout for the queue in
// the bench loop's wall time (issue 22; bench/RESULTS.md, "Issue 22, session 17"). It
// is BenchmarkQueueThroughput's and the quick suite's queue shape at the quick suite's
// size: per case, one goroutine sends layoutMessages messages in batches of 100, then
// W workers (1, 4 and 16) each receive 100 and ack them until the queue is empty. Each
// b.Loop iteration is a round: every system at every W, the systems in an order that
// rotates with the round and W, each case followed by a VACUUM of its table (outside
// the timing). Run it with -benchtime 5x (5 rounds) or more (make
// bench-queue-layouts); it is not in make test.
//
// The pools commit synchronously (synchronous_commit on, as the bench suite's do),
// 18 connections each. Systems:
//
//   - streamd: Client.Send, Receive (Max 100), Ack;
//   - pgmq-batched, raw: internal/queuebaseline's statements;
//   - shared-bare: streamd's statements on streamd.queue_messages written bare, as
//     client statements (no PL/pgSQL): the send is sendDirectSQL without
//     queue_send_target (no queue lock, no read of the queue's row, no payload limit
//     check), its blocks of offsets taken inline from the queue's sequence; the
//     receive is queue_receive's lease UPDATE of the rows locked SKIP LOCKED in offset
//     order (the main range only, not the delayed lane; a message that used up its
//     attempts is left for queue_receive, as a direct receive would decline to it),
//     with the token expression (the random half drawn by the client) and the 16
//     columns of its answer; the ack is queue_ack's range DELETE with the token
//     filter, answering ackSQL's one row;
//   - perqueue-lean-text, perqueue-lean-uuid: a table of the queue's own, keyed by
//     "offset" alone (a sequence of its own counting in blocks of 128), no queue name
//     in the row, message_id as text or as uuid (sent in binary), the rare columns
//     nullable at the end, the dedup and delayed-lane partial indexes, fillfactor and
//     autovacuum as queue_messages; the same statements as shared-bare;
//   - partition-lean: queue_messages' columns in a LIST-partitioned parent (by queue
//     name, no parent key), the queue's partition keyed by "offset" alone; the same
//     statements addressed to the partition by name.
//
// The bare systems run on a pool with the queue functions' settings (generic plans,
// no sequential or bitmap scans, no hash or merge joins): as client statements, their
// plans would otherwise be the planner's choice at each call (bench/RESULTS.md, session
// 13). Every message's payload is its own; each case checks that its drain got every
// message exactly once (the count and a sum of the payloads' FNV-1a hashes).
//
// It logs, per system and W, the medians over the rounds of the send, drain and
// overall msgs/s, the overall rate ÷ pgmq-batched's and ÷ raw's in the same round
// (median and min–max), and the server CPU (the pools' backends' run time from
// /proc/<pid>/schedstat, when the database is on this machine) and client CPU
// (getrusage) per batch of 100 of each phase. STREAMD_LAYOUT_SYSTEMS (a comma list),
// STREAMD_LAYOUT_WORKERS and STREAMD_LAYOUT_MESSAGES narrow a run;
// STREAMD_LAYOUT_RESIDENT=QxM fills the shared table with Q other queues of M messages
// each (env.resident); with
// STREAMD_LAYOUT_EXPLAIN set to a file name, it writes there the plans of one send,
// receive and ack per system (env.explain).
func BenchmarkQueueLayouts(b *testing.B) {
	n := layoutEnvInt(b, "STREAMD_LAYOUT_MESSAGES", layoutMessages) / 100 * 100
	workers := []int{1, 4, 16}
	if v := os.Getenv("STREAMD_LAYOUT_WORKERS"); v != "" {
		workers = nil
		for _, f := range strings.Split(v, ",") {
			w, err := strconv.Atoi(f)
			require.NoError(b, err)
			workers = append(workers, w)
		}
	}
	env := newLayoutEnv(b, n)
	systems := env.systems(b)
	if v := os.Getenv("STREAMD_LAYOUT_SYSTEMS"); v != "" {
		keep := strings.Split(v, ",")
		systems = slices.DeleteFunc(systems, func(s *layoutSystem) bool { return !slices.Contains(keep, s.name) })
	}
	require.NotEmpty(b, systems)
	env.resident(b, os.Getenv("STREAMD_LAYOUT_RESIDENT"))
	// The lines go to stdout: the testing package truncates a benchmark's log.
	fmt.Printf("load at start: %s; %d messages a case; %d rows in streamd.queue_messages\n", loadAvg(), n, env.sharedRows(b))

	// A warm-up case per system (its connections made, its statements prepared),
	// before b.Loop starts the timer; not counted.
	for _, s := range systems {
		env.run(b, s, workers[len(workers)-1])
	}
	cases := map[layoutKey][]layoutCase{}
	for round := 0; b.Loop(); round++ {
		for wi, w := range workers {
			for j := range systems {
				s := systems[(round+wi+j)%len(systems)]
				c := env.run(b, s, w)
				cases[layoutKey{s.name, w}] = append(cases[layoutKey{s.name, w}], c)
				fmt.Printf("round %d w=%d %-18s send %6.0f drain %6.0f overall %6.0f msgs/s; server µs/batch %4.0f / %4.0f; client %4.0f / %4.0f\n",
					round, w, s.name, c.sendRate(n), c.drainRate(n), c.rate(n),
					c.perBatch(c.serverSend, n), c.perBatch(c.serverDrain, n), c.perBatch(c.clientSend, n), c.perBatch(c.clientDrain, n))
			}
		}
	}
	fmt.Printf("load at end: %s\n%s", loadAvg(), layoutTable(systems, workers, cases, n))
	if path := os.Getenv("STREAMD_LAYOUT_EXPLAIN"); path != "" {
		b.StopTimer()
		env.explain(b, systems, path)
	}
	for _, s := range systems {
		for _, w := range workers {
			if r, ok := layoutRatio(cases, s.name, "pgmq-batched", w, n); ok && s.name != "pgmq-batched" {
				b.ReportMetric(median(r), fmt.Sprintf("%s_w%d/pgmq_batched", s.name, w))
			}
		}
	}
}

// layoutMessages is the quick suite's QueueMessages.
const layoutMessages = 20_000

func layoutEnvInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	i, err := strconv.Atoi(v)
	require.NoError(b, err, name)
	return i
}

// layoutEnv is what the cases share: the pools, the Client, the payloads and their
// expected checksum, the scratch schema, the backends whose CPU is counted.
type layoutEnv struct {
	ctx      context.Context
	pool     *pgxpool.Pool // streamd's Client and the baselines, as in the bench suite
	bare     *pgxpool.Pool // the bare statements, with the functions' settings
	client   *Client
	schema   string     // quoted
	payloads [][]string // per batch
	sum      uint64     // the payloads' checksum as the database returns them

	mu   sync.Mutex
	pids map[uint32]bool
}

func newLayoutEnv(b *testing.B, n int) *layoutEnv {
	ctx := context.Background()
	e := &layoutEnv{ctx: ctx, pids: map[uint32]bool{}}
	open := func(params map[string]string) *pgxpool.Pool {
		cfg := testdb.Config(b)
		cfg.MaxConns = 18
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
		for k, v := range params {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
		cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
			e.mu.Lock()
			e.pids[c.PgConn().PID()] = true
			e.mu.Unlock()
			return nil
		}
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(b, err)
		b.Cleanup(p.Close)
		return p
	}
	e.pool = open(nil)
	e.bare = open(map[string]string{"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off",
		"enable_bitmapscan": "off", "enable_hashjoin": "off", "enable_mergejoin": "off"})
	var err error
	e.client, err = NewClient(e.pool, nil)
	require.NoError(b, err)
	e.schema = pgx.Identifier{strings.ReplaceAll(testdb.Name("layout"), "-", "_")}.Sanitize()
	_, err = e.pool.Exec(ctx, "CREATE SCHEMA "+e.schema)
	require.NoError(b, err)
	b.Cleanup(func() { _, _ = e.pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+e.schema+" CASCADE") })

	// Message i of batch k carries order k*100+i, so that every payload is its own.
	all := make([]string, 0, n)
	for k := range n / 100 {
		batch := make([]string, 100)
		for i := range batch {
			batch[i] = fmt.Sprintf(`{"order":%d,"customer":"c-%d","amount":%d.5}`, k*100+i, i%97, i)
		}
		e.payloads = append(e.payloads, batch)
		all = append(all, batch...)
	}
	var back []string // as jsonb hands them back
	require.NoError(b, e.pool.QueryRow(ctx, `SELECT array_agg(p::jsonb::text) FROM unnest($1::text[]) p`, all).Scan(&back))
	for _, p := range back {
		e.sum += payloadHash([]byte(p))
	}
	return e
}

func payloadHash(p []byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(p)
	return h.Sum64()
}

// sharedRows is how many rows queue_messages holds (other queues' messages, which the
// shared table's key holds around the bench's queues).
func (e *layoutEnv) sharedRows(b *testing.B) int64 {
	var k int64
	require.NoError(b, e.pool.QueryRow(e.ctx, `SELECT count(*) FROM streamd.queue_messages`).Scan(&k))
	return k
}

// serverCPU is the run time of every backend of the two pools so far (0 when the
// database is not on this machine).
func (e *layoutEnv) serverCPU() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	var total time.Duration
	for pid := range e.pids {
		bs, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			continue
		}
		var ns int64
		if _, err := fmt.Sscan(string(bs), &ns); err == nil {
			total += time.Duration(ns)
		}
	}
	return total
}

func clientCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func loadAvg() string {
	bs, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(bs))[:3], " ")
}

// layoutSystem is one queue: how it sends batch k, how a worker takes, hands over and
// settles one batch (the messages it got and their payloads' checksum; 0 when empty),
// and which table to vacuum after a case.
type layoutSystem struct {
	name   string
	send   func(ctx context.Context, k int) error
	drain  func(ctx context.Context) (int, uint64, error)
	vacuum string
}

type layoutKey struct {
	system  string
	workers int
}

type layoutCase struct {
	send, drain             time.Duration
	serverSend, serverDrain time.Duration
	clientSend, clientDrain time.Duration
}

func (c layoutCase) sendRate(n int) float64  { return float64(n) / c.send.Seconds() }
func (c layoutCase) drainRate(n int) float64 { return float64(n) / c.drain.Seconds() }
func (c layoutCase) rate(n int) float64      { return float64(n) / (c.send + c.drain).Seconds() }
func (c layoutCase) perBatch(d time.Duration, n int) float64 {
	return float64(d.Microseconds()) / float64(n/100)
}

// run sends e's payloads through s, drains them with w workers, checks that every
// message came back once, and vacuums s's table.
func (e *layoutEnv) run(b *testing.B, s *layoutSystem, w int) layoutCase {
	ctx := e.ctx
	var c layoutCase
	s0, c0 := e.serverCPU(), clientCPU()
	t0 := time.Now()
	for k := range e.payloads {
		require.NoError(b, s.send(ctx, k), s.name)
	}
	c.send = time.Since(t0)
	s1, c1 := e.serverCPU(), clientCPU()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		got  int
		sum  uint64
		errs []error
	)
	t1 := time.Now()
	for range w {
		wg.Add(1)
		go func() { // owner: run; exits when its drain finds the queue empty, or on an error
			defer wg.Done()
			var k int
			var h uint64
			for {
				m, mh, err := s.drain(ctx)
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					break
				}
				if m == 0 {
					break
				}
				k, h = k+m, h+mh
			}
			mu.Lock()
			got, sum = got+k, sum+h
			mu.Unlock()
		}()
	}
	wg.Wait()
	c.drain = time.Since(t1)
	s2, c2 := e.serverCPU(), clientCPU()
	c.serverSend, c.serverDrain = s1-s0, s2-s1
	c.clientSend, c.clientDrain = c1-c0, c2-c1
	require.Empty(b, errs, s.name)
	require.Equal(b, len(e.payloads)*100, got, "%s w=%d: messages drained", s.name, w)
	require.Equal(b, e.sum, sum, "%s w=%d: checksum of the payloads drained", s.name, w)
	_, err := e.pool.Exec(ctx, "VACUUM "+s.vacuum)
	require.NoError(b, err)
	return c
}

// systems builds every system's queue or table and its statements.
func (e *layoutEnv) systems(b *testing.B) []*layoutSystem {
	ctx := e.ctx
	var out []*layoutSystem

	// streamd: the Client.
	q := testdb.Name("layout")
	require.NoError(b, e.client.CreateQueue(ctx, q, nil))
	b.Cleanup(func() { _ = e.client.DeleteQueue(context.Background(), q) })
	msgs := make([][]OutgoingMessage, len(e.payloads))
	for k, batch := range e.payloads {
		msgs[k] = make([]OutgoingMessage, len(batch))
		for i, p := range batch {
			msgs[k][i] = OutgoingMessage{Data: json.RawMessage(p)}
		}
	}
	out = append(out, &layoutSystem{name: "streamd", vacuum: "streamd.queue_messages",
		send: func(ctx context.Context, k int) error {
			_, err := e.client.Send(ctx, q, msgs[k]...)
			return err
		},
		drain: func(ctx context.Context) (int, uint64, error) {
			got, err := e.client.Receive(ctx, q, &ReceiveOpts{Max: 100})
			if err != nil || len(got) == 0 {
				return 0, 0, err
			}
			rs := make([]Receipt, len(got))
			var h uint64
			for i, m := range got {
				rs[i], h = m.Receipt, h+payloadHash(m.Data)
			}
			return len(got), h, e.client.Ack(ctx, rs...)
		}})

	// The baselines, on queuebaseline's tables and statements.
	raw := e.schema + ".raw"
	pgmq := e.schema + ".pgmq"
	_, err := e.pool.Exec(ctx, fmt.Sprintf(queuebaseline.RawTable, raw)+";"+fmt.Sprintf(queuebaseline.PgmqTable, pgmq))
	require.NoError(b, err)
	rawDrain, pgmqRead, pgmqDelete := fmt.Sprintf(queuebaseline.RawDrain, raw), fmt.Sprintf(queuebaseline.PgmqRead, pgmq),
		fmt.Sprintf(queuebaseline.PgmqDelete, pgmq)
	scan := func(rows pgx.Rows, err error) ([]int64, uint64, error) {
		if err != nil {
			return nil, 0, err
		}
		defer rows.Close()
		var ids []int64
		var h uint64
		for rows.Next() {
			var id int64
			var p []byte
			if err := rows.Scan(&id, &p); err != nil {
				return nil, 0, err
			}
			ids, h = append(ids, id), h+payloadHash(p)
		}
		return ids, h, rows.Err()
	}
	out = append(out, &layoutSystem{name: "pgmq-batched", vacuum: pgmq,
		send: func(ctx context.Context, k int) error {
			return queuebaseline.Send(ctx, e.pool, queuebaseline.PgmqSend, pgmq, e.payloads[k])
		},
		drain: func(ctx context.Context) (int, uint64, error) {
			ids, h, err := scan(e.pool.Query(ctx, pgmqRead, 100))
			if err != nil || len(ids) == 0 {
				return 0, 0, err
			}
			_, err = e.pool.Exec(ctx, pgmqDelete, ids)
			return len(ids), h, err
		}})
	out = append(out, &layoutSystem{name: "raw", vacuum: raw,
		send: func(ctx context.Context, k int) error {
			return queuebaseline.Send(ctx, e.pool, queuebaseline.RawSend, raw, e.payloads[k])
		},
		drain: func(ctx context.Context) (int, uint64, error) {
			ids, h, err := scan(e.pool.Query(ctx, rawDrain, 100))
			return len(ids), h, err
		}})

	// shared-bare: a queue of queue_messages, its own sequence.
	sq := testdb.Name("layout_bare")
	require.NoError(b, e.client.CreateQueue(ctx, sq, nil))
	b.Cleanup(func() { _ = e.client.DeleteQueue(context.Background(), sq) })
	var seq string
	require.NoError(b, e.pool.QueryRow(ctx, `SELECT offset_seq::text FROM streamd.queues WHERE queue_name = $1`, sq).Scan(&seq))
	out = append(out, e.bareSystem("shared-bare", sq, "streamd.queue_messages", seq, true, false, false))

	// perqueue-lean: a table and a sequence of the queue's own.
	for _, id := range []string{"text", "uuid"} {
		table, seq := e.schema+".lean_"+id, e.schema+".lean_"+id+"_offsets"
		e.leanTable(b, table, id)
		_, err := e.pool.Exec(ctx, "CREATE SEQUENCE "+seq+" INCREMENT BY 128")
		require.NoError(b, err)
		out = append(out, e.bareSystem("perqueue-lean-"+id, testdb.Name("layout_lean"), table, seq, false, id == "uuid", false))
	}
	// perqueue-guarded: the lean table (text ids) of a queue of streamd.queues, with
	// its settings read from there and the delayed lane received.
	gq := testdb.Name("layout_guarded")
	require.NoError(b, e.client.CreateQueue(ctx, gq, nil))
	b.Cleanup(func() { _ = e.client.DeleteQueue(context.Background(), gq) })
	e.leanTable(b, e.schema+".guarded", "text")
	out = append(out, e.bareSystem("perqueue-guarded", gq, e.schema+".guarded", "", false, false, true))

	// partition-lean: queue_messages' columns, LIST-partitioned by queue, the queue's
	// partition keyed by its offsets alone. A second partition holds another queue.
	pq := testdb.Name("layout_part")
	parent, part, pseq := e.schema+".parts", e.schema+".part_q", e.schema+".part_q_offsets"
	_, err = e.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (LIKE streamd.queue_messages INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
			PARTITION BY LIST (stream_name);
		CREATE TABLE %[2]s PARTITION OF %[1]s FOR VALUES IN (%[4]s) WITH (`+layoutStorage+`);
		ALTER TABLE %[2]s ADD PRIMARY KEY ("offset");
		CREATE UNIQUE INDEX ON %[2]s (message_id) WHERE dedup;
		CREATE INDEX ON %[2]s (due_at) WHERE "offset" >= 4503599627370496;
		ALTER TABLE %[2]s ENABLE ROW LEVEL SECURITY;
		CREATE POLICY tenant_isolation ON %[2]s
		    USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()));
		CREATE TABLE %[1]s_other PARTITION OF %[1]s FOR VALUES IN ('other') WITH (`+layoutStorage+`);
		CREATE SEQUENCE %[3]s INCREMENT BY 128`, parent, part, pseq, quoteLiteral(pq)))
	require.NoError(b, err)
	out = append(out, e.bareSystem("partition-lean", pq, part, pseq, true, false, false))
	return out
}

// leanTable creates a queue's own table: keyed by "offset" alone (from a sequence
// counting in blocks of 128), no queue name, message_id of type id, the rare columns
// nullable at the end, queue_messages' partial dedup and delayed-lane indexes, its
// row-level security and storage parameters.
func (e *layoutEnv) leanTable(b *testing.B, table, id string) {
	_, err := e.pool.Exec(e.ctx, fmt.Sprintf(`CREATE TABLE %[1]s (
			"offset"              bigint      PRIMARY KEY,
			enqueued_at           timestamptz NOT NULL,
			visibility_timeout    timestamptz NOT NULL,
			delivery_attempts     integer     NOT NULL DEFAULT 0,
			dedup                 boolean     NOT NULL DEFAULT false,
			lease_token           uuid,
			message_id            %[2]s       NOT NULL,
			data                  jsonb,
			data_bytes            bytea,
			tenant_id             text,
			group_key             text,
			metadata              jsonb,
			max_delivery_attempts integer,
			dead_letter_stream    text,
			last_error            text,
			origin_stream         text,
			origin_offset         bigint,
			origin_attempts       integer,
			dead_lettered_at      timestamptz,
			due_at                timestamptz,
			CHECK ((data IS NULL) <> (data_bytes IS NULL))
		) WITH (`+layoutStorage+`);
		CREATE UNIQUE INDEX ON %[1]s (message_id) WHERE dedup;
		CREATE INDEX ON %[1]s (due_at) WHERE "offset" >= 4503599627370496;
		ALTER TABLE %[1]s ENABLE ROW LEVEL SECURITY;
		CREATE POLICY tenant_isolation ON %[1]s
		    USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))`, table, id))
	require.NoError(b, err)
}

// layoutStorage is queue_messages' storage parameters (migration 0086).
const layoutStorage = `fillfactor = 50, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 500,
	autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0`

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// bareSystem is a queue served by bare client statements on table (quoted): named
// says the rows carry the queue's name (stream_name), uuidIDs that message_id is a
// uuid sent in binary (text otherwise). seq is the queue's sequence, counting in
// blocks of 128.
func (e *layoutEnv) bareSystem(name, queue, table, seq string, named, uuidIDs, guarded bool) *layoutSystem {
	nameCol, nameVal, nameCond := "", "", "$1::text IS NOT NULL"
	if named {
		nameCol, nameVal = "stream_name, ", "$1, "
	}
	if table == "streamd.queue_messages" { // a partition's rows are all its queue's
		nameCond = "x.stream_name = $1"
	}
	idType := "text"
	if uuidIDs {
		idType = "uuid"
	}
	ackName := strings.ReplaceAll(nameCond, "x.", "m.")
	// The send: sendDirectSQL's INSERT without queue_send_target, the blocks inline.
	sendSQL := fmt.Sprintf(`WITH t AS MATERIALIZED (
			SELECT ARRAY(SELECT nextval(%[1]s::regclass) FROM generate_series(1, (cardinality($2::%[2]s[]) + 127) / 128)) AS blocks,
			       clock_timestamp() AS now, nullif(current_setting('streamd.tenant_id', true), '') AS tenant
			WHERE $1::text IS NOT NULL
		), ins AS (
			INSERT INTO %[3]s (%[4]s"offset", message_id, data, enqueued_at, visibility_timeout, tenant_id)
			SELECT %[5]st.blocks[(u.i - 1) / 128 + 1] + (u.i - 1) %% 128, u.id, u.d::jsonb, t.now, t.now, t.tenant
			FROM t CROSS JOIN LATERAL unnest($2::%[2]s[], $3::text[]) WITH ORDINALITY u(id, d, i)
		)
		SELECT t.blocks FROM t`, quoteLiteral(seq), idType, table, nameCol, nameVal)
	// The receive: queue_receive's lease of the main range, its token and its answer.
	receiveSQL := fmt.Sprintf(`UPDATE %[1]s m
		SET delivery_attempts = m.delivery_attempts + 1, visibility_timeout = now() + $3::bigint * interval '1 millisecond',
		    lease_token = encode($4::bytea || int8send($5::bigint # m."offset"), 'hex')::uuid
		WHERE m.ctid = ANY(ARRAY(
			SELECT x.ctid FROM %[1]s x
			WHERE %[2]s AND x."offset" < 4503599627370496 AND x.visibility_timeout <= now()
			  AND x.delivery_attempts < coalesce(x.max_delivery_attempts, $6::integer)
			ORDER BY x."offset" LIMIT $2 FOR UPDATE SKIP LOCKED))
		RETURNING m."offset", m.message_id, m.data, m.metadata, m.enqueued_at, m.visibility_timeout,
		          m.delivery_attempts, coalesce(m.max_delivery_attempts, $6::integer), m.lease_token,
		          m.group_key, m.last_error, m.origin_stream, m.origin_offset, m.origin_attempts, m.dead_lettered_at,
		          m.data_bytes`, table, nameCond)
	if guarded {
		// The send reads the queue's row (its limit, the queue_send_check of an
		// oversized message, the FIFO flag) and takes its blocks from
		// queue_offset_blocks, as sendDirectSQL does, but takes no lock: a queue that
		// is a table of its own goes with DROP TABLE, whose lock waits for the
		// statements on it, and a send after it fails on the missing table.
		sendSQL = fmt.Sprintf(`WITH t AS MATERIALIZED (
				SELECT q AS qr, q.max_payload_bytes AS maxb, streamd.queue_offset_blocks(q.offset_seq, cardinality($2::text[])) AS blocks,
				       clock_timestamp() AS now, nullif(current_setting('streamd.tenant_id', true), '') AS tenant
				FROM streamd.queues q WHERE q.queue_name = $1 AND NOT q.fifo
			), ins AS (
				INSERT INTO %[1]s ("offset", message_id, data, enqueued_at, visibility_timeout, tenant_id)
				SELECT t.blocks[(u.i - 1) / 128 + 1] + (u.i - 1) %% 128,
				       CASE WHEN u.d IS NULL OR octet_length(u.d) > t.maxb
				            THEN streamd.queue_send_check(t.qr, $2, $3, NULL, NULL, NULL, NULL) ELSE u.id END,
				       u.d::jsonb, t.now, t.now, t.tenant
				FROM t CROSS JOIN LATERAL unnest($2::text[], $3::text[]) WITH ORDINALITY u(id, d, i)
			)
			SELECT t.blocks FROM t`, table)
		// The receive reads the queue's lease and attempts from its row, and takes
		// due messages of the delayed lane first, then the main range, as
		// queue_receive does; a message that used up its attempts is left for
		// queue_receive (a direct receive would decline to it). The queue's values
		// are initplans, not a join: joined to the queue's row, the locking scans
		// cost the drain 12% more server CPU at 4 workers and 27% at 16, part of it
		// rescanning the row for every row they read past (the other workers'
		// messages in flight; bench/RESULTS.md, "Issue 22, session 17").
		receiveSQL = fmt.Sprintf(`WITH q AS MATERIALIZED (
				SELECT q.visibility_timeout_ms AS vt, q.max_delivery_attempts AS att, clock_timestamp() AS now
				FROM streamd.queues q WHERE q.queue_name = $1 AND NOT q.fifo)
			UPDATE %[1]s m
			SET delivery_attempts = m.delivery_attempts + 1,
			    visibility_timeout = (SELECT q.now + coalesce($3::bigint, q.vt) * interval '1 millisecond' FROM q),
			    lease_token = encode($4::bytea || int8send($5::bigint # m."offset"), 'hex')::uuid
			WHERE m.ctid = ANY(ARRAY(
				SELECT c.ctid FROM (
					(SELECT * FROM (SELECT x.ctid FROM %[1]s x
					 WHERE x."offset" >= 4503599627370496 AND x.due_at <= (SELECT q.now FROM q)
					   AND x.visibility_timeout <= (SELECT q.now FROM q)
					   AND x.delivery_attempts < coalesce(x.max_delivery_attempts, (SELECT q.att FROM q))
					 ORDER BY x.due_at LIMIT $2 FOR UPDATE SKIP LOCKED) lane)
					UNION ALL
					(SELECT * FROM (SELECT x.ctid FROM %[1]s x
					 WHERE x."offset" < 4503599627370496 AND x.visibility_timeout <= (SELECT q.now FROM q)
					   AND x.delivery_attempts < coalesce(x.max_delivery_attempts, (SELECT q.att FROM q))
					 ORDER BY x."offset" LIMIT $2 FOR UPDATE SKIP LOCKED) head)
					LIMIT $2) c))
			RETURNING m."offset", m.message_id, m.data, m.metadata, m.enqueued_at, m.visibility_timeout,
			          m.delivery_attempts, coalesce(m.max_delivery_attempts, (SELECT q.att FROM q)), m.lease_token,
			          m.group_key, m.last_error, m.origin_stream, m.origin_offset, m.origin_attempts, m.dead_lettered_at,
			          m.data_bytes`, table)
	}
	// The ack: queue_ack's range DELETE, ackSQL's one-row answer.
	ackSQL := fmt.Sprintf(`WITH d AS (
			DELETE FROM %[1]s m
			WHERE %[2]s AND m."offset" BETWEEN $4 AND $5 AND m."offset" + 0 = ANY($2::bigint[])
			  AND m.lease_token = ANY($3::uuid[])
			RETURNING m."offset", m.lease_token)
		SELECT count(*), CASE WHEN count(*) < $6 THEN array_agg(d."offset") END,
		       CASE WHEN count(*) < $6 THEN array_agg(d.lease_token) END
		FROM d`, table, ackName)

	return &layoutSystem{name: name, vacuum: table,
		send: func(ctx context.Context, k int) error {
			data := e.payloads[k]
			// Client.send's checks of each message.
			for i, d := range data {
				if !json.Valid([]byte(d)) || pgtext.JSONProblem([]byte(d)) != "" {
					return fmt.Errorf("message %d: not JSON", i)
				}
			}
			var ids any
			if uuidIDs {
				u := make([][16]byte, len(data))
				r := make([]byte, 16*len(data))
				_, _ = rand.Read(r)
				for i := range u {
					copy(u[i][:], r[16*i:])
					u[i][6] = u[i][6]&0x0f | 0x40
					u[i][8] = u[i][8]&0x3f | 0x80
				}
				ids = u
			} else {
				ids = freshIDs(len(data))
			}
			var blocks []int64
			if err := e.bare.QueryRow(ctx, sendSQL, queue, ids, data).Scan(&blocks); err != nil {
				return err
			}
			if len(blocks) != (len(data)+offsetBlock-1)/offsetBlock {
				return fmt.Errorf("%d blocks for %d messages", len(blocks), len(data))
			}
			return nil
		},
		drain: func(ctx context.Context) (int, uint64, error) {
			var tok [16]byte
			_, _ = rand.Read(tok[:])
			tok[6] = tok[6]&0x0f | 0x40
			tok[8] = tok[8]&0x3f | 0x80
			args := []any{queue, 100, nil, tok[:8], int64(binary.BigEndian.Uint64(tok[8:]))}
			if !guarded {
				args = append(args, int32(5)) // the queue's settings, as constants
				args[2] = int64(30_000)
			}
			rows, err := e.bare.Query(ctx, receiveSQL, args...)
			if err != nil {
				return 0, 0, err
			}
			var got []*Message
			for rows.Next() {
				m, err := scanMessage(rows, queue, true)
				if err != nil {
					rows.Close()
					return 0, 0, err
				}
				got = append(got, m)
			}
			rows.Close()
			if err := rows.Err(); err != nil || len(got) == 0 {
				return 0, 0, err
			}
			rs := make([]Receipt, len(got))
			var h uint64
			lo, hi := got[0].Offset, got[0].Offset
			for i, m := range got {
				rs[i], h = m.Receipt, h+payloadHash(m.Data)
				lo, hi = min(lo, m.Offset), max(hi, m.Offset)
			}
			offs, toks := receiptArrays(rs)
			missed, err := readAck(e.bare.QueryRow(ctx, ackSQL, queue, offs, toks, lo, hi, len(rs)), rs)
			if err != nil {
				return 0, 0, err
			}
			if len(missed) > 0 {
				return 0, 0, fmt.Errorf("%s: %d receipts not acked", name, len(missed))
			}
			return len(got), h, nil
		}}
}

// layoutRatio is each round's overall rate of system over ref's at w workers.
func layoutRatio(cases map[layoutKey][]layoutCase, system, ref string, w, n int) ([]float64, bool) {
	a, r := cases[layoutKey{system, w}], cases[layoutKey{ref, w}]
	if len(a) == 0 || len(a) != len(r) {
		return nil, false
	}
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i].rate(n) / r[i].rate(n)
	}
	return out, true
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// layoutTable is the summary, a markdown table: medians over the rounds.
func layoutTable(systems []*layoutSystem, workers []int, cases map[layoutKey][]layoutCase, n int) string {
	var sb strings.Builder
	sb.WriteString("| system | W | send msgs/s | drain msgs/s | overall msgs/s | ÷ pgmq-batched (min–max) | ÷ raw (min–max) | server µs/batch send / drain | client µs/batch send / drain |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---|---|---|---|\n")
	of := func(cs []layoutCase, f func(layoutCase) float64) float64 {
		v := make([]float64, len(cs))
		for i, c := range cs {
			v[i] = f(c)
		}
		return median(v)
	}
	ratio := func(s string, ref string, w int) string {
		r, ok := layoutRatio(cases, s, ref, w, n)
		if !ok || s == ref {
			return "–"
		}
		return fmt.Sprintf("%.2f (%.2f–%.2f)", median(r), slices.Min(r), slices.Max(r))
	}
	for _, w := range workers {
		for _, s := range systems {
			cs := cases[layoutKey{s.name, w}]
			if len(cs) == 0 {
				continue
			}
			fmt.Fprintf(&sb, "| %s | %d | %.0f | %.0f | %.0f | %s | %s | %.0f / %.0f | %.0f / %.0f |\n", s.name, w,
				of(cs, func(c layoutCase) float64 { return c.sendRate(n) }),
				of(cs, func(c layoutCase) float64 { return c.drainRate(n) }),
				of(cs, func(c layoutCase) float64 { return c.rate(n) }),
				ratio(s.name, "pgmq-batched", w), ratio(s.name, "raw", w),
				of(cs, func(c layoutCase) float64 { return c.perBatch(c.serverSend, n) }),
				of(cs, func(c layoutCase) float64 { return c.perBatch(c.serverDrain, n) }),
				of(cs, func(c layoutCase) float64 { return c.perBatch(c.clientSend, n) }),
				of(cs, func(c layoutCase) float64 { return c.perBatch(c.clientDrain, n) }))
		}
	}
	return sb.String()
}

// explain writes to path, per system, the plans (EXPLAIN ANALYZE, BUFFERS, WAL, by
// auto_explain, the functions' statements included) of the last send of a case, the
// first receive and ack of its drain (the queue holding all of its messages, as in the
// rounds) and the empty receive that ends it, on pools of one connection each, with
// one worker. Each system runs a whole case before the one written, so that the
// client's prepared statements are past their first five executions (plan_cache_mode
// auto plans them generically from there, when the generic plan costs no more).
func (e *layoutEnv) explain(b *testing.B, systems []*layoutSystem, path string) {
	ctx := e.ctx
	var (
		mu      sync.Mutex
		notices []string
	)
	open := func(params map[string]string) *pgxpool.Pool {
		cfg := testdb.Config(b)
		cfg.MaxConns = 1
		for k, v := range params {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
		cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			mu.Lock()
			notices = append(notices, n.Message)
			mu.Unlock()
		}
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, `LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;
				SET auto_explain.log_analyze = on; SET auto_explain.log_buffers = on; SET auto_explain.log_wal = on;
				SET auto_explain.log_nested_statements = on; SET auto_explain.log_level = notice;
				SET client_min_messages = notice`)
			return err
		}
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(b, err)
		b.Cleanup(p.Close)
		return p
	}
	pool, bare := e.pool, e.bare
	e.pool = open(nil)
	e.bare = open(map[string]string{"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off",
		"enable_bitmapscan": "off", "enable_hashjoin": "off", "enable_mergejoin": "off"})
	client := e.client
	var err error
	e.client, err = NewClient(e.pool, nil)
	require.NoError(b, err)
	defer func() { e.pool, e.bare, e.client = pool, bare, client }()

	var out strings.Builder
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		t := notices
		notices = nil
		return t
	}
	for _, s := range systems {
		for i := range 2 {
			var send []string
			for k := range e.payloads {
				take()
				require.NoError(b, s.send(ctx, k))
				send = take()
			}
			var first, empty []string
			for j := 0; ; j++ {
				k, _, err := s.drain(ctx)
				require.NoError(b, err)
				if j == 0 {
					first = take()
				}
				if k == 0 {
					empty = take()
					break
				}
				take()
			}
			if i == 1 {
				fmt.Fprintf(&out, "=== %s: the last send of 100\n%s\n=== %s: the first receive and ack of 100\n%s\n=== %s: the empty receive\n%s\n",
					s.name, strings.Join(send, "\n"), s.name, strings.Join(first, "\n"), s.name, strings.Join(empty, "\n"))
			}
		}
		_, err := pool.Exec(ctx, "VACUUM "+s.vacuum)
		require.NoError(b, err)
	}
	require.NoError(b, os.WriteFile(path, []byte(out.String()), 0o644))
}

// resident, given "QxM", creates Q more queues of M messages each in queue_messages,
// half of them named to sort before the bench's queues and half after, so that the
// shared table's key holds other queues around them, as a deployment's does (the
// per-queue tables and the partition are not affected: their statements name them).
// The queues go when the benchmark ends.
func (e *layoutEnv) resident(b *testing.B, spec string) {
	if spec == "" {
		return
	}
	var q, m int
	_, err := fmt.Sscanf(spec, "%dx%d", &q, &m)
	require.NoError(b, err, "STREAMD_LAYOUT_RESIDENT")
	msgs := make([]OutgoingMessage, 100)
	for i := range msgs {
		msgs[i] = OutgoingMessage{Data: json.RawMessage(`{"resident":true,"order":1,"customer":"c-1"}`)}
	}
	for i := range q {
		name := testdb.Name([]string{"laya", "layz"}[i%2])
		require.NoError(b, e.client.CreateQueue(e.ctx, name, nil))
		b.Cleanup(func() { _ = e.client.DeleteQueue(context.Background(), name) })
		for k := 0; k < m; k += 100 {
			_, err := e.client.Send(e.ctx, name, msgs[:min(100, m-k)]...)
			require.NoError(b, err)
		}
	}
	_, err = e.pool.Exec(e.ctx, "VACUUM ANALYZE streamd.queue_messages")
	require.NoError(b, err)
}
