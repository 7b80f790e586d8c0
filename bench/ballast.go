package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	schema "github.com/streamd/streamd/sql"
	"github.com/streamd/streamd/streams"
)

// The growth scenario's ballast: events already in the log when it measures. They
// belong to a real stream, ballastStream, appended the way streamd's own COPY fast
// path appends (streamd.append_reserve on the partition's head row, then COPY of the
// rows with their offsets, in one transaction per batch), so that the head rows stay
// consistent with the rows even when a load is interrupted. The baseline table,
// growthCopyTable (LIKE streamd.events INCLUDING ALL), holds the same rows.
//
// The ballast lives in a database of its own on the same server, <database>_growth,
// never in the benchmark's database: there a log of 50M events would slow every other
// scenario (each case ends with a VACUUM of streamd.events, which scans its indexes)
// and show up among the streams of whoever uses the project's database. It is kept
// between runs, because loading 50M rows takes many minutes: a run grows it to the
// size it needs and leaves it there. Sizes below the kept ballast cannot be had from
// it (rows cannot be taken out of a table cheaply), so they are measured in a
// temporary database, <database>_growth_tmp_<run id>, loaded from empty and dropped at
// the end of the scenario. DropBallast drops both kinds.

const (
	ballastStream     = "bench-ballast"
	ballastPartitions = 4
	ballastPayload    = 100
	// ballastBatch is the rows of one COPY (and one transaction) of the load.
	ballastBatch = 5000
	// ballastChunk is how many rows per partition one side loads before the other
	// side's turn: the two sides alternate, so that background load hits both.
	ballastChunk = 250_000
	// ballastLockKey is the advisory lock (in the kept database) that a growth
	// scenario holds from start to end: runs that share a server take turns.
	ballastLockKey = "streamd-bench-ballast"
	// ballastBytesPerRow is the disk a 100-byte ballast row takes in one table, heap
	// and indexes, when no loaded ballast says better (measured: 455-460 bytes at 200k
	// rows; the two indexes split half-full, as the partitions' inserts interleave).
	ballastBytesPerRow = 480
)

// growthCopyTable is the growth scenario's baseline table: streamd.events' columns,
// defaults, constraints and indexes, holding the same ballast rows.
var growthCopyTable = pgx.Identifier{"streamd_bench", "growth_copy"}

// ballastDBName is the kept ballast database of the benchmark's database base.
func ballastDBName(base string) string { return base + "_growth" }

// tempDBPrefix starts the names of the temporary ballast databases.
func tempDBPrefix(base string) string { return base + "_growth_tmp_" }

// growthDB is a database the growth scenario measures in, migrated, with the ballast
// stream and the baseline table.
type growthDB struct {
	name string
	temp bool
	pool *pgxpool.Pool
	// env is an Env on pool, sharing the run's suite, run id and logger.
	env *Env
	// lock holds the kept database's advisory lock (nil for a temporary database).
	lock *pgxpool.Conn
}

// openGrowthDB creates database name when it does not exist, connects to it with
// env's settings, migrates it and sets up the ballast stream and the baseline table.
// For the kept database (temp false) it first takes the advisory lock, waiting for
// another run's growth scenario to end.
func openGrowthDB(ctx context.Context, env *Env, name string, temp bool) (*growthDB, error) {
	var exists bool
	if err := env.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return nil, err
	}
	if !exists {
		if _, err := env.Pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42P04" { // duplicate_database: another run was first
				return nil, fmt.Errorf("create database %s: %w", name, err)
			}
		}
	}
	cfg := env.Pool.Config().Copy()
	cfg.ConnConfig.Database = name
	cfg.MaxConns, cfg.MinConns = 8, 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", name, err)
	}
	g := &growthDB{name: name, temp: temp, pool: pool}
	g.env = &Env{Pool: pool, Client: streams.NewClient(pool, &streams.ClientConfig{Logger: env.Logger}), Suite: env.Suite,
		RunID: env.RunID, Logger: env.Logger}
	if err := g.setup(ctx); err != nil {
		if temp {
			_ = dropDB(ctx, env, g)
		} else {
			g.close()
		}
		return nil, err
	}
	return g, nil
}

func (g *growthDB) setup(ctx context.Context) error {
	if !g.temp {
		conn, err := g.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		g.lock = conn
		var got bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", ballastLockKey).Scan(&got); err != nil {
			return err
		}
		if !got {
			g.env.Logger.Info("growth: waiting for another run's growth scenario", "database", g.name)
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", ballastLockKey); err != nil {
				return err
			}
		}
	}
	if _, err := schema.Migrate(ctx, g.pool); err != nil {
		return fmt.Errorf("migrate %s: %w", g.name, err)
	}
	if err := g.env.Client.CreateStream(ctx, ballastStream, ballastPartitions); err != nil {
		return err
	}
	if err := g.ensureCopyTable(ctx); err != nil {
		return err
	}
	return g.removeLeftovers(ctx)
}

// close releases the lock and closes the pool.
func (g *growthDB) close() {
	if g.lock != nil {
		g.lock.Release() // the session ends with the pool, and the lock with it
		g.lock = nil
	}
	g.pool.Close()
}

// tableShapeSQL describes a table's columns and indexes without its name, to tell
// whether the baseline table still matches streamd.events.
const tableShapeSQL = `SELECT coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull, ', ' ORDER BY a.attnum)
	FROM pg_attribute a WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped), '') || ' | ' ||
	coalesce((SELECT string_agg(d, ', ' ORDER BY d) FROM (SELECT i.indisunique::text || ' ' || regexp_replace(pg_get_indexdef(i.indexrelid), '^.* USING ', '') AS d
	FROM pg_index i WHERE i.indrelid = $1::text::regclass) x), '')`

// ensureCopyTable creates the baseline table, or re-creates it (empty) when
// streamd.events has changed shape since (a migration added a column or an index).
func (g *growthDB) ensureCopyTable(ctx context.Context) error {
	table := growthCopyTable.Sanitize()
	if _, err := g.pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS streamd_bench"); err != nil {
		return err
	}
	var exists bool
	if err := g.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		return err
	}
	if exists {
		var events, copies string
		if err := g.pool.QueryRow(ctx, tableShapeSQL, "streamd.events").Scan(&events); err != nil {
			return fmt.Errorf("events shape: %w", err)
		}
		if err := g.pool.QueryRow(ctx, tableShapeSQL, table).Scan(&copies); err != nil {
			return fmt.Errorf("baseline table shape: %w", err)
		}
		if events == copies {
			return nil
		}
		g.env.Logger.Warn("growth: streamd.events changed shape, the baseline table is rebuilt", "database", g.name)
		if _, err := g.pool.Exec(ctx, "DROP TABLE "+table); err != nil {
			return err
		}
	}
	_, err := g.pool.Exec(ctx, "CREATE TABLE "+table+" (LIKE streamd.events INCLUDING ALL)")
	return err
}

// removeLeftovers deletes the streams and baseline rows that an interrupted run left
// next to the ballast.
func (g *growthDB) removeLeftovers(ctx context.Context) error {
	rows, err := g.pool.Query(ctx, "SELECT stream_name FROM streamd.streams WHERE stream_name <> $1", ballastStream)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := g.env.Client.DeleteStream(ctx, n); err != nil && !errors.Is(err, streams.ErrStreamNotFound) {
			return err
		}
	}
	// Two ranges of the primary key rather than "<>", which would scan the whole table.
	tag, err := g.pool.Exec(ctx, "DELETE FROM "+growthCopyTable.Sanitize()+" WHERE stream_name < $1 OR stream_name > $1", ballastStream)
	if err != nil {
		return err
	}
	if len(names) > 0 || tag.RowsAffected() > 0 {
		g.env.Logger.Info("growth: removed an interrupted run's leftovers", "database", g.name, "streams", len(names), "baseline_rows", tag.RowsAffected())
		if _, err := g.pool.Exec(ctx, "VACUUM streamd.events"); err != nil {
			return err
		}
		if _, err := g.pool.Exec(ctx, "VACUUM "+growthCopyTable.Sanitize()); err != nil {
			return err
		}
	}
	return nil
}

// ballastSize returns the ballast events per partition in streamd.events (the head
// rows' log end) and in the baseline table (its highest offset plus one).
func (g *growthDB) ballastSize(ctx context.Context) (events, copies []int64, err error) {
	info, err := g.env.Client.DescribeStream(ctx, ballastStream)
	if err != nil {
		return nil, nil, err
	}
	events = make([]int64, ballastPartitions)
	copies = make([]int64, ballastPartitions)
	for _, pi := range info.PartitionInfo {
		if int(pi.Partition) < ballastPartitions {
			events[pi.Partition] = pi.NextOffset
		}
	}
	for p := range copies {
		if err := g.pool.QueryRow(ctx, `SELECT coalesce(max("offset") + 1, 0) FROM `+growthCopyTable.Sanitize()+`
			WHERE stream_name = $1 AND partition = $2`, ballastStream, int32(p)).Scan(&copies[p]); err != nil {
			return nil, nil, err
		}
	}
	return events, copies, nil
}

func sum64(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

// ballastLoad is what growing the ballast measured: one load per side ("streamd":
// streamd.events, "copy": the baseline table), zero when that side had nothing to load.
type ballastLoad struct {
	streamd, copy             loadResult
	streamdSamples, cpSamples []time.Duration
	from                      int64 // events in the log before
	vacuum                    time.Duration
}

// grow loads ballast rows until each partition of both tables holds perPart events,
// the two sides taking turns by chunks, then vacuums and analyzes both tables and
// asks for a checkpoint (so that the load's dirty pages are not written out during
// the measurements that follow).
func (g *growthDB) grow(ctx context.Context, perPart int64) (ballastLoad, error) {
	var bl ballastLoad
	ev, cp, err := g.ballastSize(ctx)
	if err != nil {
		return bl, err
	}
	bl.from = sum64(ev)
	var toLoad int64
	for p := range ev {
		toLoad += max(perPart-ev[p], 0) + max(perPart-cp[p], 0)
	}
	if toLoad == 0 {
		return bl, nil
	}
	if err := g.checkRoom(ctx, toLoad); err != nil {
		return bl, err
	}
	g.env.Logger.Info("growth: loading ballast", "database", g.name, "from", bl.from, "to", perPart*ballastPartitions, "rows_both_tables", toLoad)
	pl := payloads(ballastPayload, 64)
	for chunk := 0; ; chunk++ {
		evGoal, cpGoal := make([]int64, len(ev)), make([]int64, len(cp))
		left := false
		for p := range ev {
			evGoal[p] = min(ev[p]+ballastChunk, max(perPart, ev[p]))
			cpGoal[p] = min(cp[p]+ballastChunk, max(perPart, cp[p]))
			left = left || evGoal[p] > ev[p] || cpGoal[p] > cp[p]
		}
		if !left {
			break
		}
		sides := []bool{true, false} // streamd.events first
		if chunk%2 == 1 {
			sides = []bool{false, true}
		}
		for _, events := range sides {
			cur, goal, total, samples := cp, cpGoal, &bl.copy, &bl.cpSamples
			if events {
				cur, goal, total, samples = ev, evGoal, &bl.streamd, &bl.streamdSamples
			}
			l, s, err := g.loadSide(ctx, events, cur, goal, pl)
			if err != nil {
				return bl, err
			}
			total.records += l.records
			total.bytes += l.bytes
			total.elapsed += l.elapsed
			total.clientCPU += l.clientCPU
			total.serverCPU += l.serverCPU
			*samples = append(*samples, s...)
		}
		g.env.Logger.Info("growth: ballast", "database", g.name, "events", sum64(ev), "baseline_rows", sum64(cp))
	}
	t0 := time.Now()
	for _, table := range []string{"streamd.events", growthCopyTable.Sanitize()} {
		if _, err := g.pool.Exec(ctx, "VACUUM (ANALYZE) "+table); err != nil {
			return bl, fmt.Errorf("vacuum %s: %w", table, err)
		}
	}
	if _, err := g.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		g.env.Logger.Warn("growth: no checkpoint after the load", "error", err)
	}
	bl.vacuum = time.Since(t0)
	return bl, nil
}

// loadSide appends rows to each partition p of one table (streamd.events when events,
// else the baseline table) from cur[p] up to goal[p], one goroutine per partition,
// batches of ballastBatch, and advances cur. It returns the totals and one latency
// sample per batch.
func (g *growthDB) loadSide(ctx context.Context, events bool, cur, goal []int64, pl []json.RawMessage) (loadResult, []time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	before := sampleCPU(ctx, g.env)
	start := time.Now()
	type out struct {
		records, bytes int64
		samples        []time.Duration
		err            error
	}
	outs := make([]out, len(cur))
	var wg sync.WaitGroup
	for p := range cur {
		if cur[p] >= goal[p] {
			continue
		}
		wg.Add(1)
		go func() { // owner: loadSide; exits at the goal, or on an error (which cancels the others)
			defer wg.Done()
			o := &outs[p]
			var rows [][]any
			for cur[p] < goal[p] && ctx.Err() == nil {
				n := int(min(int64(ballastBatch), goal[p]-cur[p]))
				t0 := time.Now()
				var b int
				if events {
					var base int64
					err := pgx.BeginFunc(ctx, g.pool, func(tx pgx.Tx) error {
						var ts time.Time
						if err := tx.QueryRow(ctx, "SELECT base, ts FROM streamd.append_reserve($1, $2, $3, $4)",
							ballastStream, int32(p), n, ballastPayload).Scan(&base, &ts); err != nil {
							return fmt.Errorf("reserve: %w", err)
						}
						rows, b = ballastRows(rows, int32(p), base, n, ts, pl)
						_, err := tx.CopyFrom(ctx, pgx.Identifier{"streamd", "events"}, copyColumns, pgx.CopyFromRows(rows))
						return err
					})
					if err != nil {
						o.err = fmt.Errorf("ballast %s/%d: %w", ballastStream, p, err)
						cancel()
						return
					}
					cur[p] = base + int64(n)
				} else {
					rows, b = ballastRows(rows, int32(p), cur[p], n, time.Now(), pl)
					if err := copyBatchInto(ctx, g.pool, growthCopyTable, rows); err != nil {
						o.err = fmt.Errorf("ballast baseline/%d: %w", p, err)
						cancel()
						return
					}
					cur[p] += int64(n)
				}
				o.samples = append(o.samples, time.Since(t0))
				o.records += int64(n)
				o.bytes += int64(b)
			}
		}()
	}
	wg.Wait()
	res := loadResult{elapsed: time.Since(start)}
	res.clientCPU, res.serverCPU = cpuSince(context.WithoutCancel(ctx), g.env, before)
	var samples []time.Duration
	for _, o := range outs {
		if o.err != nil {
			return res, nil, o.err
		}
		res.records += o.records
		res.bytes += o.bytes
		samples = append(samples, o.samples...)
	}
	return res, samples, ctx.Err()
}

// ballastRows fills out with the n ballast rows of partition part from offset base.
// A row is a function of its partition and offset only, so that both tables get the
// same rows (but their timestamps).
func ballastRows(out [][]any, part int32, base int64, n int, ts time.Time, pl []json.RawMessage) ([][]any, int) {
	out = out[:0]
	bytes := 0
	for i := range n {
		off := base + int64(i)
		key := fmt.Sprintf("user-%06d", (off*7919+int64(part))%100000)
		data := pl[off%int64(len(pl))]
		out = append(out, []any{ballastStream, part, off, fmt.Sprintf("ballast-%d-%012d", part, off), "bench", key, data, ts, int32(1)})
		bytes += len(data) + len(key)
	}
	return out, bytes
}

// checkRoom is checkBallastRoom for a load into g, with the bytes per row measured on
// what g already holds when that is enough to say.
func (g *growthDB) checkRoom(ctx context.Context, rows int64) error {
	perRow := float64(ballastBytesPerRow)
	if ev, cp, err := g.ballastSize(ctx); err == nil && sum64(ev)+sum64(cp) >= 200_000 {
		var size int64
		if err := g.pool.QueryRow(ctx, `SELECT pg_total_relation_size('streamd.events') + pg_total_relation_size($1::text::regclass)`,
			growthCopyTable.Sanitize()).Scan(&size); err == nil {
			perRow = float64(size) / float64(sum64(ev)+sum64(cp))
		}
	}
	return checkBallastRoom(ctx, g.pool, rows, perRow, g.env.Logger)
}

// checkBallastRoom refuses a load of rows ballast rows (both tables counted) of
// perRow bytes each that would leave less than 5 GB free on the server's data
// directory (when it is on this machine), or whose WAL an inactive replication slot
// would keep (anywhere on the server).
func checkBallastRoom(ctx context.Context, pool *pgxpool.Pool, rows int64, perRow float64, logger *slog.Logger) error {
	if rows <= 0 {
		return nil
	}
	need := int64(float64(rows) * perRow)
	if rows >= 1_000_000 {
		// About 550 bytes of WAL per 100-byte row and table (bench/RESULTS.md's profile).
		rs, err := pool.Query(ctx, "SELECT slot_name FROM pg_replication_slots WHERE NOT active")
		if err != nil {
			return err
		}
		slots, err := pgx.CollectRows(rs, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(slots) > 0 {
			return fmt.Errorf("loading %d ballast rows writes about %.0f GB of WAL, which the inactive replication slot(s) %s would keep: drop them (pg_drop_replication_slot) first",
				rows, float64(rows)*550/1e9, strings.Join(slots, ", "))
		}
	}
	var dir string
	if err := pool.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return nil // not allowed to know: the server is not ours to check
	}
	if _, err := os.Stat(dir); err != nil {
		return nil // a server on another machine
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return nil
	}
	free := int64(st.Bavail) * st.Bsize
	const margin = 5 << 30
	if need+margin > free {
		return fmt.Errorf("loading %d ballast rows takes about %.1f GB (%.0f bytes a row), and %s has %.1f GB free (5 GB must stay free): free space, drop the kept ballast (streamd-bench -drop-ballast) or use smaller sizes (-growth-log)",
			rows, float64(need)/1e9, perRow, dir, float64(free)/1e9)
	}
	logger.Info("growth: room for the load", "rows", rows, "gb_needed", float64(need)/1e9, "gb_free", float64(free)/1e9)
	return nil
}

// dropTempDBs drops the temporary ballast databases that no session uses (left by
// runs that died). Call it with the kept database's lock held: every live run holds
// that lock while its temporary database exists, so none of these is in use.
func dropTempDBs(ctx context.Context, env *Env, base string) error {
	rows, err := env.Pool.Query(ctx, `SELECT datname FROM pg_database d WHERE starts_with(datname, $1)
		AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)`, tempDBPrefix(base))
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, n := range names {
		env.Logger.Info("growth: dropping a dead run's temporary database", "database", n)
		if _, err := env.Pool.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{n}.Sanitize()); err != nil {
			return fmt.Errorf("drop database %s: %w", n, err)
		}
	}
	return nil
}

// DropBallast drops the growth scenario's kept ballast database of pool's database,
// and the temporary ones that dead runs left, ending their sessions. It returns the
// names it dropped.
func DropBallast(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	base := pool.Config().ConnConfig.Database
	rows, err := pool.Query(ctx, `SELECT datname FROM pg_database WHERE datname = $1 OR starts_with(datname, $2)`,
		ballastDBName(base), tempDBPrefix(base))
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, err := pool.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{n}.Sanitize()+" WITH (FORCE)"); err != nil {
			return nil, fmt.Errorf("drop database %s: %w", n, err)
		}
	}
	return names, nil
}

// dropDB closes g and drops its database.
func dropDB(ctx context.Context, env *Env, g *growthDB) error {
	g.close()
	_, err := env.Pool.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+pgx.Identifier{g.name}.Sanitize()+" WITH (FORCE)")
	return err
}
