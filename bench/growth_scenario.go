package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// growthScenario measures produce and fetch with the log already holding 0, 10M and
// 50M events (full suite; 0 and 500k quick), each against its raw baseline in the same
// database at the same size (ballast.go says where the ballast lives and how it is
// kept between runs):
//
//   - produce-streamd: streams.Client.Produce, batches of 1000, 4 connections, one
//     partition each (the produce reference's shape), for the case duration on a
//     fresh stream; produce-copy: the same rows COPY'd into the baseline table, which
//     holds the same ballast rows. Each case's rows are deleted afterwards, and each
//     table is vacuumed once per size, after its cases, so that every case starts on
//     a vacuumed table, as in the produce scenario.
//   - fetch-streamd: streams.Client.Fetch reading a fresh one-partition stream of half
//     the fetch scenario's size (written with Client.Produce with the ballast in place),
//     in batches of the fetch batch, after a warm-up pass; fetch-raw-select: the
//     fetch scenario's primary-key range read of the same rows from streamd.events.
//   - load-streamd and load-copy: the ballast load itself, when this run loaded any
//     (rows/s of COPY with offsets reserved on the head rows into streamd.events, and of
//     COPY into the baseline table; 4 connections, one partition each, batches of 5000,
//     the two sides taking turns every million rows).
//
// The two sides of each pair alternate which goes first from one size to the next.
// Ratios are to the baseline at the same size; the results carry the size in
// Params.LogEvents and their names ("log=10M").
type growthScenario struct{}

// Last: its loads, vacuums and checkpoints would disturb the scenarios after it.
func init() { register(100, growthScenario{}) }

func (growthScenario) Name() string { return "growth" }

// runsOnce: loading a log of millions of events is its cost; Suite.Repeats does not apply.
func (growthScenario) runsOnce() bool { return true }

const (
	growthConns = 4
	growthBatch = 1000
)

// growthStep is one log size and whether it is measured in the temporary database
// (sizes below the kept ballast) or the kept one.
type growthStep struct {
	events int64
	temp   bool
}

// growthPlan assigns each size (ascending) to a database, given the kept ballast.
func growthPlan(kept int64, sizes []int64) []growthStep {
	out := make([]growthStep, len(sizes))
	for i, s := range sizes {
		out[i] = growthStep{events: s, temp: s < kept}
	}
	return out
}

// checkSizes validates the suite's log sizes.
func checkSizes(sizes []int64) error {
	for i, n := range sizes {
		if n < 0 || n%ballastPartitions != 0 || (i > 0 && n <= sizes[i-1]) {
			return fmt.Errorf("growth: log sizes %v must ascend and be multiples of %d", sizes, ballastPartitions)
		}
	}
	return nil
}

// preflight checks, before the run starts, that the ballast this run will load fits
// on the disk: the kept ballast grown to the largest size, plus a temporary database
// for the sizes below what is kept now.
func (growthScenario) preflight(ctx context.Context, env *Env) error {
	sizes := env.Suite.GrowthLogEvents
	if err := checkSizes(sizes); err != nil || len(sizes) == 0 {
		return err
	}
	base := env.Pool.Config().ConnConfig.Database
	var kept int64
	perRow := float64(ballastBytesPerRow)
	var exists bool
	if err := env.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", ballastDBName(base)).Scan(&exists); err != nil {
		return err
	}
	if exists {
		cfg := env.Pool.Config().Copy()
		cfg.ConnConfig.Database = ballastDBName(base)
		cfg.MaxConns, cfg.MinConns = 1, 0
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return err
		}
		defer pool.Close()
		var size int64
		// Errors leave the estimate at nothing kept: a database whose creation was
		// interrupted has no schema yet.
		if pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0), pg_total_relation_size('streamd.events') + coalesce(pg_total_relation_size(to_regclass($2)), 0)
			FROM streamd.stream_partitions WHERE stream_name = $1`, ballastStream, growthCopyTable.Sanitize()).Scan(&kept, &size) == nil && kept >= 100_000 {
			perRow = float64(size) / float64(2*kept)
		}
	}
	var rows int64
	plan := growthPlan(kept, sizes)
	for i := len(plan) - 1; i >= 0; i-- {
		if plan[i].temp { // the largest temporary size, loaded from empty
			rows += 2 * plan[i].events
			break
		}
	}
	if last := plan[len(plan)-1]; !last.temp {
		rows += 2 * (last.events - kept)
	}
	return checkBallastRoom(ctx, env.Pool, rows, perRow, env.Logger)
}

func (s growthScenario) Run(ctx context.Context, env *Env) ([]Result, error) {
	sizes := env.Suite.GrowthLogEvents
	if err := checkSizes(sizes); err != nil {
		return nil, err
	}
	if len(sizes) == 0 {
		return nil, nil
	}
	base := env.Pool.Config().ConnConfig.Database
	kept, err := openGrowthDB(ctx, env, ballastDBName(base), false)
	if err != nil {
		return nil, fmt.Errorf("growth: %w", err)
	}
	defer kept.close()
	if err := dropTempDBs(ctx, env, base); err != nil {
		return nil, fmt.Errorf("growth: %w", err)
	}
	ev, _, err := kept.ballastSize(ctx)
	if err != nil {
		return nil, fmt.Errorf("growth: %w", err)
	}
	keptBefore := sum64(ev)
	plan := growthPlan(keptBefore, sizes)
	var temp *growthDB
	if plan[0].temp {
		if temp, err = openGrowthDB(ctx, env, tempDBPrefix(base)+env.RunID, true); err != nil {
			return nil, fmt.Errorf("growth: %w", err)
		}
		defer func() {
			if err := dropDB(ctx, env, temp); err != nil {
				env.Logger.Warn("growth: temporary database not dropped", "database", temp.name, "error", err)
			}
		}()
	}

	var out []Result
	var notes []string
	for i, step := range plan {
		g := kept
		if step.temp {
			g = temp
		}
		rs, note, err := s.measureAt(ctx, env, g, step, i)
		if err != nil {
			return nil, fmt.Errorf("growth log=%s: %w", countLabel(int(step.events)), err)
		}
		out = append(out, rs...)
		notes = append(notes, note)
	}
	var size string
	if err := kept.pool.QueryRow(ctx, `SELECT pg_size_pretty(pg_database_size(current_database()))`).Scan(&size); err == nil {
		notes = append(notes, fmt.Sprintf("The kept ballast database `%s` holds %s events at the end (%s on disk); it held %s before this run.",
			kept.name, countLabel(int(max(keptBefore, sizes[len(sizes)-1]))), size, countLabel(int(keptBefore))))
	}
	env.AddNote("growth", "Growth: the ballast", strings.Join(notes, "\n")+"\n")
	return out, nil
}

// measureAt brings g's ballast to step's size, then measures produce and fetch there.
// It returns the results and a line for the report's note.
func (s growthScenario) measureAt(ctx context.Context, env *Env, g *growthDB, step growthStep, i int) ([]Result, string, error) {
	label := countLabel(int(step.events))
	size := env.Suite.Payloads[0]
	where := fmt.Sprintf("kept database `%s`", g.name)
	if g.temp {
		where = fmt.Sprintf("temporary database `%s` (below the kept ballast)", g.name)
	}
	var out []Result
	note := fmt.Sprintf("- log=%s: %s; ", label, where)

	// The ballast, and its load's rates when this run loaded any.
	bl, err := g.grow(ctx, step.events/ballastPartitions)
	if err != nil {
		return nil, "", err
	}
	lp := Params{PayloadBytes: ballastPayload, BatchSize: ballastBatch, Conns: ballastPartitions, Partitions: ballastPartitions,
		Mode: "log=" + label, LogEvents: step.events}
	var loads []Result
	for _, side := range []struct {
		system   string
		baseline bool
		load     loadResult
		samples  []time.Duration
	}{{"load-streamd", false, bl.streamd, bl.streamdSamples}, {"load-copy", true, bl.copy, bl.cpSamples}} {
		if side.load.records == 0 {
			continue
		}
		side.load.latency = summarize(side.samples)
		r := loadToResult("growth", side.system, side.baseline, lp, side.load)
		r.Note = fmt.Sprintf("grew the ballast from %s to %s events (%d rows loaded into this table); VACUUM ANALYZE of both tables and a CHECKPOINT took %.1f s after",
			countLabel(int(bl.from)), label, side.load.records, bl.vacuum.Seconds())
		env.Logger.Info("case", "case", r.Case, "records_per_sec", int(r.RecordsPerSec))
		loads = append(loads, r)
	}
	if len(loads) == 2 {
		loads[0].RatioTo, loads[0].Ratio = loads[1].Case, ratio(loads[0].RecordsPerSec, loads[1].RecordsPerSec)
	}
	if len(loads) > 0 {
		note += fmt.Sprintf("loaded from %s events (%.1f s, then %.1f s of VACUUM ANALYZE and CHECKPOINT)",
			countLabel(int(bl.from)), (bl.streamd.elapsed + bl.copy.elapsed).Seconds(), bl.vacuum.Seconds())
	} else if step.events == 0 {
		note += "no ballast"
	} else {
		note += "ballast reused as it was"
	}
	// Say plainly whether this size can show growth at all: a log that fits in
	// shared_buffers is read from memory whatever its size.
	var logBytes, sharedBuffers int64
	if err := g.pool.QueryRow(ctx, `SELECT pg_total_relation_size('streamd.events'), pg_size_bytes(current_setting('shared_buffers'))`).Scan(&logBytes, &sharedBuffers); err == nil && step.events > 0 {
		if logBytes <= sharedBuffers {
			note += fmt.Sprintf("; the log (%s with its indexes) fits in shared_buffers (%s): this size cannot show growth", bytesLabel(logBytes), bytesLabel(sharedBuffers))
		} else {
			note += fmt.Sprintf("; the log (%s with its indexes) is %.1f× shared_buffers (%s)", bytesLabel(logBytes), float64(logBytes)/float64(sharedBuffers), bytesLabel(sharedBuffers))
		}
	}
	out = append(out, loads...)

	// Produce, against COPY into the baseline table at the same size.
	p := Params{PayloadBytes: size, BatchSize: growthBatch, Conns: growthConns, Partitions: ballastPartitions,
		Mode: "log=" + label, LogEvents: step.events}
	// Each table is vacuumed once per size, after its cases: every case still starts
	// on a vacuumed table, and a VACUUM of a 50M-row table, which may scan its
	// indexes whole, runs twice per size instead of four times.
	drop := func(ctx context.Context, stream string) error { return g.env.Client.DeleteStream(ctx, stream) }
	clean := func(ctx context.Context, stream string) error {
		if _, err := g.pool.Exec(ctx, "DELETE FROM "+growthCopyTable.Sanitize()+" WHERE stream_name = $1", stream); err != nil {
			return fmt.Errorf("clean baseline table: %w", err)
		}
		if _, err := g.pool.Exec(ctx, "VACUUM "+growthCopyTable.Sanitize()); err != nil {
			return fmt.Errorf("vacuum baseline table: %w", err)
		}
		return nil
	}
	produce := []func() (Result, error){
		func() (Result, error) { return produceStreamdCase(ctx, g.env, "growth", "produce-streamd", p, drop) },
		func() (Result, error) {
			return produceCopyCase(ctx, g.env, "growth", "produce-copy", p, growthCopyTable, clean)
		},
	}
	pair := make([]Result, 2)
	for j := range produce {
		k := (i + j) % 2
		if pair[k], err = produce[k](); err != nil {
			return nil, "", err
		}
	}
	pair[0].RatioTo, pair[0].Ratio = pair[1].Case, ratio(pair[0].RecordsPerSec, pair[1].RecordsPerSec)
	out = append(out, pair...)

	// Fetch, against the raw range read of the same rows: a stream half the fetch
	// scenario's (the log's size is what varies here), to keep the quick suite short.
	n := env.Suite.FetchRecords[size] / 2
	if n <= 0 {
		return out, note, vacuumEvents(ctx, g)
	}
	stream := g.env.StreamName("growth-fetch", label)
	if err := g.env.Client.CreateStream(ctx, stream, 1); err != nil {
		return nil, "", err
	}
	// On an error; else deleted below, and a run that dies leaves it to the next run's
	// removeLeftovers.
	defer func() { _ = g.env.Client.DeleteStream(context.WithoutCancel(ctx), stream) }()
	if err := loadFetchStream(ctx, g.env, stream, size, n); err != nil {
		return nil, "", err
	}
	batch := env.Suite.FetchBatch
	fp := Params{PayloadBytes: size, BatchSize: batch, Conns: 1, Partitions: 1, Mode: "log=" + label, LogEvents: step.events}
	readers := []fetchReader{
		{"fetch-streamd", false, streamdReader(g.env, stream, batch)},
		{"fetch-raw-select", true, rawReader(g.env, "streamd.events", stream, batch)},
	}
	if i%2 == 1 {
		readers[0], readers[1] = readers[1], readers[0]
	}
	fr, err := fetchCases(ctx, g.env, "growth", fp, n, readers)
	if err != nil {
		return nil, "", err
	}
	if fr[0].Baseline {
		fr[0], fr[1] = fr[1], fr[0]
	}
	fr[0].RatioTo, fr[0].Ratio = fr[1].Case, ratio(fr[0].RecordsPerSec, fr[1].RecordsPerSec)
	if err := g.env.Client.DeleteStream(ctx, stream); err != nil {
		return nil, "", err
	}
	return append(out, fr...), note, vacuumEvents(ctx, g)
}

// vacuumEvents vacuums g's events table, outside the timings.
func vacuumEvents(ctx context.Context, g *growthDB) error {
	if _, err := g.pool.Exec(context.WithoutCancel(ctx), "VACUUM streamd.events"); err != nil {
		return fmt.Errorf("vacuum events: %w", err)
	}
	return nil
}

// bytesLabel is n bytes in MiB or GiB.
func bytesLabel(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
}
