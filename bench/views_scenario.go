package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/streamd/streamd/consumergroup"
)

// viewsScenario times the monitoring views (issue 5) on a large log: a stream of 4
// partitions filled with 1M events (quick; 10M full) by the trusted insert path, with
// a retention policy and a live consumer group on it. Each view query runs many times,
// interleaved; the baseline is the query a view would run if it scanned the log: a
// count and the oldest and newest timestamps of the stream's events. Each query is a
// timing-only result (one sample: one query, rows read to the end); ratios are the
// scan's median time over the query's. EXPLAIN (ANALYZE, BUFFERS) of each query says
// how many events rows it touched and how many buffers it read; it goes into a note.
type viewsScenario struct{}

func init() { register(70, viewsScenario{}) }

func (viewsScenario) Name() string { return "views" }

const viewsPartitions = 4

// viewQuery is one timed query.
type viewQuery struct {
	system, sql string
	stream      bool // takes the stream name as $1
	baseline    bool
}

var viewQueries = []viewQuery{
	{"group-status-stream", `SELECT * FROM streamd.consumer_group_status WHERE stream_name = $1`, true, false},
	{"group-status-seed", `SELECT * FROM streamd.consumer_group_status WHERE lag > 1000 ORDER BY lag DESC`, false, false},
	{"retention-status-stream", `SELECT * FROM streamd.retention_policy_status WHERE stream_name = $1`, true, false},
	{"retention-status-seed", `SELECT * FROM streamd.retention_policy_status`, false, false},
	{"scan-events", `SELECT count(*), min("timestamp"), max("timestamp") FROM streamd.events WHERE stream_name = $1`, true, true},
}

func (s viewsScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	n := bySuite(env, 20_000, 1_000_000, 10_000_000)
	iters := bySuite(env, 5, 100, 200)
	scans := bySuite(env, 2, 3, 3)
	stream := env.StreamName("views")
	if err := env.Client.CreateStream(ctx, stream, viewsPartitions); err != nil {
		return nil, err
	}
	defer func() {
		t0 := time.Now()
		_ = dropStream(ctx, env, stream)
		env.Logger.Info("views: dropped", "stream", stream, "seconds", time.Since(t0).Seconds())
	}()
	t0 := time.Now()
	if err := fillStream(ctx, env.Pool, stream, viewsPartitions, n/viewsPartitions, 100); err != nil {
		return nil, err
	}
	env.Logger.Info("views: loaded", "stream", stream, "events", n, "seconds", time.Since(t0).Seconds())
	if _, err := env.Pool.Exec(ctx, `INSERT INTO streamd.retention_policies (stream_name, max_age_seconds, enabled)
		VALUES ($1, 365 * 86400, true)`, stream); err != nil {
		return nil, fmt.Errorf("views: policy: %w", err)
	}
	// A live member, starting at the log end so that it reads nothing: the group has
	// an owner per partition and no committed offset (lag = the whole log).
	group := "bench-views-" + env.RunID
	m, err := startMember(ctx, env, stream, group, "views", 10*time.Second, func(c *consumergroup.Config) {
		c.AutoOffsetReset = consumergroup.ResetLatest
	})
	if err != nil {
		return nil, err
	}
	defer m.stop()
	if _, err := waitSettledOn(ctx, env, stream, group, viewsPartitions, 1, nil, 60*time.Second); err != nil {
		return nil, err
	}

	samples := make([][]time.Duration, len(viewQueries))
	run := func(i int) error {
		q := viewQueries[i]
		var args []any
		if q.stream {
			args = []any{stream}
		}
		t0 := time.Now()
		rows, err := env.Pool.Query(ctx, q.sql, args...)
		if err != nil {
			return fmt.Errorf("views %s: %w", q.system, err)
		}
		for rows.Next() { // every row read, as a dashboard would
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("views %s: %w", q.system, err)
		}
		samples[i] = append(samples[i], time.Since(t0))
		return nil
	}
	// Warm-up: one run of each (the scan's reads the whole stream into the cache, if
	// it fits, which only helps the baseline).
	for i := range viewQueries {
		if err := run(i); err != nil {
			return nil, err
		}
		samples[i] = nil
	}
	scanEvery := max(iters/scans, 1)
	for it := 0; it < iters; it++ {
		for i, q := range viewQueries {
			if q.baseline && it%scanEvery != 0 {
				continue
			}
			if err := run(i); err != nil {
				return nil, err
			}
		}
	}

	var out []Result
	var note strings.Builder
	fmt.Fprintf(&note, "A stream of %d events in %d partitions, with a retention policy and a live group of one member; the database holds the other streams of the run too. EXPLAIN (ANALYZE, BUFFERS) of each query:\n\n", n, viewsPartitions)
	note.WriteString("| query | execution ms | shared buffers hit + read | events rows touched | events access |\n|---|---:|---:|---:|---|\n")
	for i, q := range viewQueries {
		ex, err := explainQuery(ctx, env, q, stream)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&note, "| %s | %.2f | %d | %d | %s |\n", q.system, ex.ms, ex.buffers, ex.eventRows, ex.eventNodes)
		r := timingResult("views", q.system, fmt.Sprintf("views %s %s events p=%d", q.system, countLabel(n), viewsPartitions), q.baseline,
			Params{Partitions: viewsPartitions, Conns: 1}, "one query, every row read", samples[i])
		r.Note = fmt.Sprintf("EXPLAIN: %d shared buffers, %d events rows touched (%s)", ex.buffers, ex.eventRows, ex.eventNodes)
		out = append(out, r)
	}
	ref := out[len(out)-1].Case
	for i := range out[:len(out)-1] {
		out[i].RatioTo, out[i].Ratio = ref, resultRatio(out[i], out[len(out)-1])
	}
	env.AddNote("views", fmt.Sprintf("Monitoring views on a log of %s events", countLabel(n)), note.String())
	return out, nil
}

// countLabel writes 1000000 as 1M and 20000 as 20k.
func countLabel(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

type explained struct {
	ms         float64
	buffers    int64
	eventRows  int64
	eventNodes string
}

// explainQuery runs EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) of q and sums, over the
// plan's nodes on streamd.events, the rows they returned (times their loops).
func explainQuery(ctx context.Context, env *Env, q viewQuery, stream string) (explained, error) {
	var args []any
	if q.stream {
		args = []any{stream}
	}
	var raw []byte
	if err := env.Pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q.sql, args...).Scan(&raw); err != nil {
		return explained{}, fmt.Errorf("explain %s: %w", q.system, err)
	}
	var doc []struct {
		Plan          map[string]any `json:"Plan"`
		ExecutionTime float64        `json:"Execution Time"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc) == 0 {
		return explained{}, fmt.Errorf("explain %s: %v", q.system, err)
	}
	ex := explained{ms: round3(doc[0].ExecutionTime)}
	num := func(n map[string]any, k string) int64 { f, _ := n[k].(float64); return int64(f) }
	ex.buffers = num(doc[0].Plan, "Shared Hit Blocks") + num(doc[0].Plan, "Shared Read Blocks")
	kinds := map[string]int{}
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if n["Relation Name"] == "events" {
			ex.eventRows += num(n, "Actual Rows") * max(num(n, "Actual Loops"), 1)
			kinds[fmt.Sprint(n["Node Type"])] += int(max(num(n, "Actual Loops"), 1))
		}
		subs, _ := n["Plans"].([]any)
		for _, s := range subs {
			if m, ok := s.(map[string]any); ok {
				walk(m)
			}
		}
	}
	walk(doc[0].Plan)
	var parts []string
	for k, v := range kinds {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, v))
	}
	slices.Sort(parts)
	ex.eventNodes = strings.Join(parts, ", ")
	if ex.eventNodes == "" {
		ex.eventNodes = "none"
	}
	return ex, nil
}
