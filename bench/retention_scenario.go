package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/streamd/streamd/retention"
)

// retentionScenario measures the cost of retention (issue 8): deleting the oldest N
// records of a one-partition stream (250k quick, 2M full) with retention.Runner.Apply
// and a size policy keeping the last 1000, against a raw DELETE of the same rows from
// the baseline copy table (same columns and indexes, no triggers), in the same run:
//
//   - streamd: Runner.Apply with the default BatchSize (10,000): the log start moves in
//     one short transaction, then the rows go in transactions of at most 10,000;
//   - raw-delete: one DELETE of the offset range, one transaction;
//   - raw-delete-batched: the same range in DELETEs of 10,000 rows, each its own
//     transaction, as the Runner does.
//
// Each repetition fills a fresh stream with the trusted insert path and copies its
// rows into the copy table twice (once per raw side), reads them all once (cache, hint
// bits), then runs the three sides in alternating order. Latency is one whole delete
// of N records.
type retentionScenario struct{}

func init() { register(80, retentionScenario{}) }

func (retentionScenario) Name() string { return "retention" }

// runsOnce: its cost is loading the records it deletes; Suite.Repeats does not apply.
func (retentionScenario) runsOnce() bool { return true }

const (
	retentionKeep  = 1000
	retentionBatch = 10_000
)

func (s retentionScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	n := bySuite(env, 5_000, 250_000, 2_000_000)
	reps := bySuite(env, 1, 2, 3)
	runner, err := retention.New(env.Pool, &retention.Config{BatchSize: retentionBatch, Logger: quietLogger})
	if err != nil {
		return nil, err
	}
	systems := []string{"streamd", "raw-delete", "raw-delete-batched"}
	times := make([][]time.Duration, len(systems))
	bytes := make([]int64, len(systems))
	for rep := 0; rep < reps; rep++ {
		stream := env.StreamName("retention", fmt.Sprint(rep))
		if err := env.Client.CreateStream(ctx, stream, 1); err != nil {
			return nil, err
		}
		err := func() error {
			defer func() { _ = dropStream(ctx, env, stream) }()
			defer func() { _ = cleanCopy(ctx, env, stream) }()
			if err := s.load(ctx, env, stream, n); err != nil {
				return err
			}
			order := []int{0, 1, 2}
			if rep%2 == 1 {
				order = []int{2, 1, 0}
			}
			for _, i := range order {
				table, name := "streamd.events", stream
				if i > 0 {
					table, name = copyTable.Sanitize(), stream+"-"+fmt.Sprint(i)
				}
				var k int
				var b int64
				if err := env.Pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(octet_length(data::text) + coalesce(octet_length(key), 0)), 0)
					FROM `+table+` WHERE stream_name = $1 AND partition = 0 AND "offset" < $2`, name, int64(n)).Scan(&k, &b); err != nil {
					return err
				}
				if k != n {
					return fmt.Errorf("retention %s: %d rows to delete, want %d", systems[i], k, n)
				}
				t0 := time.Now()
				deleted, err := s.delete(ctx, env, runner, systems[i], table, name, n)
				d := time.Since(t0)
				if err != nil {
					return fmt.Errorf("retention %s: %w", systems[i], err)
				}
				if deleted != int64(n) {
					return fmt.Errorf("retention %s: deleted %d rows, want %d", systems[i], deleted, n)
				}
				env.Logger.Info("retention rep", "system", systems[i], "rep", rep, "records_per_sec", int(float64(n)/d.Seconds()))
				times[i] = append(times[i], d)
				bytes[i] += b
			}
			return nil
		}()
		if err != nil {
			return nil, err
		}
	}
	var out []Result
	for i, sys := range systems {
		var sum time.Duration
		for _, d := range times[i] {
			sum += d
		}
		r := Result{
			Scenario: "retention", System: sys, Baseline: i > 0,
			Case:    fmt.Sprintf("retention %s %s of %s", sys, countLabel(n), countLabel(n+retentionKeep)),
			Params:  Params{PayloadBytes: 100, BatchSize: retentionBatch, Conns: 1, Partitions: 1},
			Records: int64(n * len(times[i])), Bytes: bytes[i], Seconds: sum.Seconds(),
			Latency: summarize(times[i]),
			Note:    fmt.Sprintf("records/s = rows deleted per second; latency = one delete of %d rows; %d repetition(s)", n, len(times[i])),
		}
		if i == 1 {
			r.Params.BatchSize = n
		}
		r.finish()
		out = append(out, r)
	}
	for i := range out {
		if i != 1 {
			out[i].RatioTo, out[i].Ratio = out[1].Case, ratio(out[i].RecordsPerSec, out[1].RecordsPerSec)
		}
	}
	return out, nil
}

// load fills stream with n+retentionKeep records, copies them into the copy table
// under the names stream-1 and stream-2, sets a size policy keeping retentionKeep and
// reads every row once.
func (retentionScenario) load(ctx context.Context, env *Env, stream string, n int) error {
	t0 := time.Now()
	if err := fillStream(ctx, env.Pool, stream, 1, n+retentionKeep, 100); err != nil {
		return err
	}
	// Every stored column but the stream name, which becomes the copy's name.
	var cols string
	if err := env.Pool.QueryRow(ctx, `SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
		WHERE attrelid = 'streamd.events'::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = ''
		  AND attname <> 'stream_name'`).Scan(&cols); err != nil {
		return fmt.Errorf("events columns: %w", err)
	}
	for i := 1; i <= 2; i++ {
		if _, err := env.Pool.Exec(ctx, `INSERT INTO `+copyTable.Sanitize()+` (stream_name, `+cols+`)
			SELECT $2, `+cols+` FROM streamd.events WHERE stream_name = $1`, stream, stream+"-"+fmt.Sprint(i)); err != nil {
			return fmt.Errorf("copy rows: %w", err)
		}
	}
	if _, err := env.Pool.Exec(ctx, `INSERT INTO streamd.retention_policies (stream_name, max_event_count, enabled) VALUES ($1, $2, true)`,
		stream, retentionKeep); err != nil {
		return fmt.Errorf("policy: %w", err)
	}
	if _, err := env.Pool.Exec(ctx, "ANALYZE "+copyTable.Sanitize()); err != nil {
		return err
	}
	env.Logger.Info("retention: loaded", "stream", stream, "records", n+retentionKeep, "seconds", time.Since(t0).Seconds())
	return nil
}

// delete removes the first n rows of partition 0 of stream (named name in table) as
// system does and returns how many it deleted.
func (retentionScenario) delete(ctx context.Context, env *Env, runner *retention.Runner, system, table, name string, n int) (int64, error) {
	switch system {
	case "streamd":
		res, err := runner.Apply(ctx, name, &retention.ApplyOpts{Force: true})
		if err != nil {
			return 0, err
		}
		return res.Deleted(), nil
	case "raw-delete":
		tag, err := env.Pool.Exec(ctx, `DELETE FROM `+table+` WHERE stream_name = $1 AND partition = 0 AND "offset" < $2`, name, int64(n))
		return tag.RowsAffected(), err
	default:
		var total int64
		for lo := int64(0); lo < int64(n); lo += retentionBatch {
			tag, err := env.Pool.Exec(ctx, `DELETE FROM `+table+` WHERE stream_name = $1 AND partition = 0 AND "offset" >= $2 AND "offset" < $3`,
				name, lo, min(lo+retentionBatch, int64(n)))
			if err != nil {
				return total, err
			}
			total += tag.RowsAffected()
		}
		return total, nil
	}
}

// cleanCopy deletes the copy table's rows of stream's copies and vacuums it.
func cleanCopy(ctx context.Context, env *Env, stream string) error {
	ctx = context.WithoutCancel(ctx)
	if _, err := env.Pool.Exec(ctx, `DELETE FROM `+copyTable.Sanitize()+` WHERE stream_name = ANY($1)`,
		[]string{stream + "-1", stream + "-2"}); err != nil {
		return err
	}
	_, err := env.Pool.Exec(ctx, "VACUUM "+copyTable.Sanitize())
	return err
}
