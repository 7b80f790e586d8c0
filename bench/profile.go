package bench

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/streamd/streamd/streams"
)

// profileScenario explains where an append's time goes. On one connection, for one
// partition and batches of ProfileBatch records, it times three ways of writing the
// same rows, each as BEGIN; statement; COMMIT with the statement and the commit timed
// apart:
//
//   - copy: pgx COPY into the baseline table;
//   - insert-unnest: INSERT ... SELECT FROM unnest(arrays) into the baseline table,
//     the statement shape streamd.append uses, without the function around it;
//   - streamd: streams.ProduceTx, i.e. streamd.append.
//
// It then runs a few appends with auto_explain logging every nested statement of
// streamd.append to the client, and reports the mean time of each.
type profileScenario struct{}

func init() { register(90, profileScenario{}) }

func (profileScenario) Name() string { return "profile" }

const insertUnnestSQL = `INSERT INTO %s
	(stream_name, partition, "offset", event_id, event_type, key, data, "timestamp", version)
SELECT $1, $2, $3 + u.i - 1, u.e, 'bench', u.k, u.d::jsonb, $4, 1
  FROM unnest($5::text[], $6::text[], $7::text[]) WITH ORDINALITY AS u(e, k, d, i)`

// reserveSQL is what an append path outside streamd.append would run first: mark
// the transaction's inserts as trusted (the offset trigger skips them) and advance
// the partition's head row through streamd.head_reserve (as every append path does),
// returning the first offset and the timestamp.
const reserveSQL = `SELECT set_config('streamd.append_trusted', 'on', true), h.base, h.ts
  FROM streamd.head_reserve($1, $2, $3) h`

// profileStage is one way of writing a batch of rows inside a transaction.
type profileStage struct {
	name, desc string
	baseline   bool
	// run writes batch iteration it from src in tx and returns its payload bytes.
	run func(ctx context.Context, tx pgx.Tx, src *rowSource, it int) (int, error)
}

// profileStages are the ways of writing a batch that the profile compares, from raw
// COPY into the baseline table to streamd.append.
func profileStages(stream string, batch int) []profileStage {
	// Each baseline stage writes its own partition of the copy table.
	insertCopy := func(part int32, conflict string) func(ctx context.Context, tx pgx.Tx, src *rowSource, it int) (int, error) {
		sql := fmt.Sprintf(insertUnnestSQL, copyTable.Sanitize()) + conflict
		return func(ctx context.Context, tx pgx.Tx, src *rowSource, it int) (int, error) {
			ids, keys, data, b := rowArrays(src, batch)
			_, err := tx.Exec(ctx, sql, stream, part, int64(it*batch), time.Now(), ids, keys, data)
			return b, err
		}
	}
	var rows [][]any
	var recs []streams.Record
	return []profileStage{
		{name: "copy", desc: "COPY into the baseline table", baseline: true,
			run: func(ctx context.Context, tx pgx.Tx, src *rowSource, it int) (int, error) {
				var b int
				rows, b = src.copyRows(rows, batch, 0, int64(it*batch), time.Now())
				_, err := tx.CopyFrom(ctx, copyTable, copyColumns, pgx.CopyFromRows(rows))
				return b, err
			}},
		{name: "insert-unnest", desc: "INSERT ... SELECT FROM unnest(arrays) into the baseline table", baseline: true,
			run: insertCopy(1, "")},
		{name: "insert-unnest-conflict", desc: "the same with ON CONFLICT (stream_name, event_id) DO NOTHING", baseline: true,
			run: insertCopy(2, " ON CONFLICT (stream_name, event_id) DO NOTHING")},
		{name: "events-copy", desc: "head-row UPDATE (trusted) + COPY into streamd.events: a COPY-based append, no dedup",
			run: func(ctx context.Context, tx pgx.Tx, src *rowSource, _ int) (int, error) {
				base, ts, err := reserveOffsets(ctx, tx, stream, 0, batch)
				if err != nil {
					return 0, err
				}
				var b int
				rows, b = src.copyRows(rows, batch, 0, base, ts)
				_, err = tx.CopyFrom(ctx, pgx.Identifier{"streamd", "events"}, copyColumns, pgx.CopyFromRows(rows))
				return b, err
			}},
		{name: "events-insert", desc: "head-row UPDATE (trusted) + INSERT ... unnest ON CONFLICT DO NOTHING into streamd.events, no plpgsql",
			run: func(ctx context.Context, tx pgx.Tx, src *rowSource, _ int) (int, error) {
				base, ts, err := reserveOffsets(ctx, tx, stream, 0, batch)
				if err != nil {
					return 0, err
				}
				ids, keys, data, b := rowArrays(src, batch)
				_, err = tx.Exec(ctx, insertEventsSQL, stream, int32(0), base, ts, ids, keys, data)
				return b, err
			}},
		{name: "streamd", desc: "streams.ProduceTx: streamd.append()",
			run: func(ctx context.Context, tx pgx.Tx, src *rowSource, _ int) (int, error) {
				var b int
				recs, b = src.records(recs, batch, 0, 1)
				_, err := streams.ProduceTx(ctx, tx, recs...)
				return b, err
			}},
	}
}

func (s profileScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	var out []Result
	for _, size := range env.Suite.Payloads {
		rs, err := s.runSize(ctx, env, size)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

type stageTimes struct {
	stmt, commit []time.Duration
	// wal is the WAL written between just before BEGIN and just after COMMIT. The
	// whole cluster's WAL: concurrent work inflates some samples, so the minimum is
	// reported.
	wal []int64
	// clientCPU and serverCPU add up the CPU time of this process and of the
	// connection's backend over the stage's transactions: unlike wall time, hardly
	// affected by other work on the machine.
	clientCPU, serverCPU time.Duration
}

func (s profileScenario) runSize(ctx context.Context, env *Env, size int) ([]Result, error) {
	su := env.Suite
	stream := env.StreamName("profile", sizeLabel(size))
	if err := env.Client.CreateStream(ctx, stream, 1); err != nil {
		return nil, err
	}
	defer func() { _ = dropStream(ctx, env, stream) }()
	if err := truncateCopy(ctx, env.Pool); err != nil {
		return nil, err
	}
	conn, err := env.Pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()

	stages := profileStages(stream, su.ProfileBatch)
	times := map[string]*stageTimes{}
	srcs := map[string]*rowSource{}
	for i, st := range stages {
		times[st.name] = &stageTimes{}
		srcs[st.name] = newRowSource(env, stream, 100+i, size)
	}
	bytesPerBatch := 0
	// Interleave the stages so that background load affects them alike.
	for it := 0; it < su.ProfileIterations; it++ {
		for _, st := range stages {
			var lsn0, lsn1 string
			if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn0); err != nil {
				return nil, err
			}
			srv0, _ := procCPU(int(pid))
			cli0 := selfCPU()
			tx, err := conn.Begin(ctx)
			if err != nil {
				return nil, err
			}
			t0 := time.Now()
			b, err := st.run(ctx, tx, srcs[st.name], it)
			if err != nil {
				_ = tx.Rollback(context.WithoutCancel(ctx))
				return nil, fmt.Errorf("profile %s: %w", st.name, err)
			}
			t1 := time.Now()
			if err := tx.Commit(ctx); err != nil {
				return nil, fmt.Errorf("profile %s commit: %w", st.name, err)
			}
			t2 := time.Now()
			srv1, _ := procCPU(int(pid))
			cli1 := selfCPU()
			var wal int64
			if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text, pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint", lsn0).Scan(&lsn1, &wal); err != nil {
				return nil, err
			}
			bytesPerBatch = b
			t := times[st.name]
			t.stmt = append(t.stmt, t1.Sub(t0))
			t.commit = append(t.commit, t2.Sub(t1))
			t.wal = append(t.wal, wal)
			t.clientCPU += cli1 - cli0
			t.serverCPU += srv1 - srv0
		}
	}

	var out []Result
	var tbl strings.Builder
	fmt.Fprintf(&tbl, "%d batches of %d records of %s, one partition, one connection (mean ms per batch):\n\n", su.ProfileIterations, su.ProfileBatch, sizeLabel(size))
	tbl.WriteString("| stage | what | statement ms | commit ms | total ms | µs per record | client CPU µs/rec | server CPU µs/rec | WAL bytes per record (min) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, st := range stages {
		t := times[st.name]
		stmt, commit := meanMs(t.stmt), meanMs(t.commit)
		nrec := float64(len(t.stmt) * su.ProfileBatch)
		cliUs, srvUs := round3(float64(t.clientCPU.Microseconds())/nrec), round3(float64(t.serverCPU.Microseconds())/nrec)
		fmt.Fprintf(&tbl, "| %s | %s | %.2f | %.2f | %.2f | %.1f | %.1f | %.1f | %d |\n", st.name, st.desc, stmt, commit, stmt+commit,
			(stmt+commit)*1000/float64(su.ProfileBatch), cliUs, srvUs, slices.Min(t.wal)/int64(su.ProfileBatch))
		total := make([]time.Duration, len(t.stmt))
		var sum time.Duration
		for i := range t.stmt {
			total[i] = t.stmt[i] + t.commit[i]
			sum += total[i]
		}
		r := Result{
			Scenario: "profile", System: st.name, Baseline: st.baseline,
			Case:    fmt.Sprintf("profile %s %s b=%d c=1 p=1", st.name, sizeLabel(size), su.ProfileBatch),
			Params:  Params{PayloadBytes: size, BatchSize: su.ProfileBatch, Conns: 1, Partitions: 1},
			Records: int64(len(total) * su.ProfileBatch), Bytes: int64(len(total) * bytesPerBatch),
			Seconds: sum.Seconds(), Latency: summarize(total),
			ClientCPUPerRecord: cliUs, ServerCPUPerRecord: srvUs,
		}
		r.finish()
		out = append(out, r)
	}
	ref := out[0].Case
	for i := 1; i < len(out); i++ {
		out[i].RatioTo, out[i].Ratio = ref, ratio(out[i].RecordsPerSec, out[0].RecordsPerSec)
	}

	stmts, err := explainAppend(ctx, env, stream, size)
	if err != nil {
		tbl.WriteString("\nauto_explain breakdown unavailable: " + err.Error() + "\n")
	} else {
		tbl.WriteString("\n" + stmts)
	}
	env.AddNote("profile", fmt.Sprintf("Where an append of %d × %s goes", su.ProfileBatch, sizeLabel(size)), tbl.String())
	if err := truncateCopy(context.WithoutCancel(ctx), env.Pool); err != nil {
		return nil, err
	}
	return out, nil
}

func meanMs(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return float64(sum) / float64(len(ds)) / 1e6
}

var durationRE = regexp.MustCompile(`(?s)^duration: ([0-9.]+) ms\s+plan:\s*\nQuery Text: (.*)`)

// explainAppend runs a few appends on a connection of its own with auto_explain
// logging every nested statement (with its duration) to the client, and returns a
// markdown table of the mean duration per statement per append.
func explainAppend(ctx context.Context, env *Env, stream string, size int) (string, error) {
	var mu sync.Mutex
	var msgs []string
	cfg := env.Pool.Config().ConnConfig.Copy()
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		msgs = append(msgs, n.Message)
		mu.Unlock()
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	const runs = 5
	src := newRowSource(env, stream, 200, size)
	var recs []streams.Record
	// One append before logging starts, so that compiling the function and planning
	// its statements (once per connection) is not counted.
	recs, _ = src.records(recs, env.Suite.ProfileBatch, 0, 1)
	if _, err := streams.ProduceTx(ctx, conn, recs...); err != nil {
		return "", err
	}
	for _, q := range []string{
		"LOAD 'auto_explain'",
		"SET auto_explain.log_min_duration = 0",
		"SET auto_explain.log_nested_statements = on",
		"SET auto_explain.log_analyze = on",
		"SET auto_explain.log_timing = off",
		"SET client_min_messages = log",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return "", fmt.Errorf("%s: %w", q, err)
		}
	}
	for i := 0; i < runs; i++ {
		recs, _ = src.records(recs, env.Suite.ProfileBatch, 0, 1)
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := streams.ProduceTx(ctx, tx, recs...)
			return err
		}); err != nil {
			return "", err
		}
	}
	mu.Lock()
	defer mu.Unlock()
	sums := map[string]float64{}
	var order []string
	for _, m := range msgs {
		sm := durationRE.FindStringSubmatch(m)
		if sm == nil {
			continue
		}
		var d float64
		fmt.Sscan(sm[1], &d)
		q := strings.Join(strings.Fields(sm[2]), " ")
		q = statementLabel(q)
		if _, ok := sums[q]; !ok {
			order = append(order, q)
		}
		sums[q] += d
	}
	if len(order) == 0 {
		return "", fmt.Errorf("auto_explain logged nothing (%d notices)", len(msgs))
	}
	slices.SortStableFunc(order, func(a, b string) int {
		switch {
		case sums[a] > sums[b]:
			return -1
		case sums[a] < sums[b]:
			return 1
		}
		return 0
	})
	var b strings.Builder
	fmt.Fprintf(&b, "Nested statements of streamd.append (auto_explain, log_timing off, mean of %d appends; the first row is the whole call):\n\n", runs)
	b.WriteString("| statement | ms per append |\n|---|---:|\n")
	for _, q := range order {
		fmt.Fprintf(&b, "| `%s` | %.2f |\n", q, sums[q]/runs)
	}
	return b.String(), nil
}

// statementLabel shortens a logged statement to something a table can show.
func statementLabel(q string) string {
	// The plan follows the query text in auto_explain's message.
	for _, cut := range []string{" Function Scan", " Insert on", " Update on", " Result ", " Aggregate ", " Subquery Scan", " CTE Scan", " Limit ", " Index Scan", " Seq Scan", " WindowAgg", " Sort ", " Hash Join", " Nested Loop", " ProjectSet", " GroupAggregate", " HashAggregate", " WindowAgg"} {
		if i := strings.Index(q, cut); i > 0 {
			q = q[:i]
		}
	}
	if len(q) > 110 {
		q = q[:110] + "…"
	}
	return strings.ReplaceAll(q, "|", "\\|")
}
