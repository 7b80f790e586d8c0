// Package retention applies streams' retention policies (streamd.retention_policies,
// written through package streamconfig or SQL): deleting a prefix of each partition
// by age, count or stored size, and key compaction. The deleting is done by the SQL
// functions of sql/functions/0400_retention.sql; this package runs them in bounded
// batches and schedules them, one runner per stream at a time across every streamd
// instance.
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/sqlerr"
)

// lockClass is the first key of the per-stream advisory lock ("SDR3"); the second is
// hashtext(stream_name). Two streams may share a hash: then they are never processed
// at the same time, which is only slower.
const lockClass int32 = 0x53445233

// Config configures a Runner. A nil *Config means the defaults.
type Config struct {
	// BatchSize is the most rows one delete transaction removes. Defaults to 10000.
	BatchSize int
	// Interval is the time between passes of Run. Defaults to 1 minute.
	Interval time.Duration
	// Logger receives the runner's log lines. Defaults to slog.Default().
	Logger *slog.Logger
	// Now returns the current time; policies' ages are measured from it. Defaults to
	// the database's clock.
	Now func() time.Time
	// Registerer receives the runner's metrics (streamd_retention_*). Defaults to nil:
	// no metrics.
	Registerer prometheus.Registerer
	// Streams limits Run and RunOnce to these streams. Defaults to every stream with
	// an enabled policy.
	Streams []string
}

func (c *Config) validate() error {
	if c.BatchSize < 0 {
		return fmt.Errorf("retention: Config.BatchSize %d: %w: must be positive", c.BatchSize, ErrInvalidArgument)
	}
	if c.Interval < 0 {
		return fmt.Errorf("retention: Config.Interval %s: %w: must be positive", c.Interval, ErrInvalidArgument)
	}
	return nil
}

// Runner applies retention policies. Its methods are safe for concurrent use; two
// runners (in one process or many) never process the same stream at the same time.
type Runner struct {
	pool    *pgxpool.Pool
	cfg     Config
	logger  *slog.Logger
	metrics *metrics
}

// New returns a Runner on pool. It fails when a Config field is invalid (naming it) or
// the metrics cannot be registered.
func New(pool *pgxpool.Pool, cfg *Config) (*Runner, error) {
	r := &Runner{pool: pool}
	if cfg != nil {
		r.cfg = *cfg
	}
	if err := r.cfg.validate(); err != nil {
		return nil, err
	}
	if r.cfg.BatchSize == 0 {
		r.cfg.BatchSize = 10000
	}
	if r.cfg.Interval == 0 {
		r.cfg.Interval = time.Minute
	}
	r.logger = r.cfg.Logger
	if r.logger == nil {
		r.logger = slog.Default()
	}
	m, err := newMetrics(r.cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r.metrics = m
	return r, nil
}

// ApplyOpts are the knobs of one Apply. A nil *ApplyOpts means the defaults.
type ApplyOpts struct {
	// DryRun reports what would be deleted, per partition, and deletes nothing.
	// Defaults to false.
	DryRun bool
	// Force ignores the policy's ProtectConsumers. Defaults to false.
	Force bool
	// Now is the time ages are measured from. Defaults to Config.Now, else the
	// database's clock. Whether a consumer group is live (ProtectConsumers) is judged
	// by the database's clock, which stamps heartbeats, or by Now when it is earlier.
	Now time.Time
}

// PartitionResult is what retention did (or, in a dry run, would do) to one partition.
type PartitionResult struct {
	Partition int32 `json:"partition"`
	// LogStartOffset and NextOffset are the partition's range before the run.
	LogStartOffset int64 `json:"log_start_offset"`
	NextOffset     int64 `json:"next_offset"`
	// NewLogStartOffset is the log start after the run.
	NewLogStartOffset int64 `json:"new_log_start_offset"`
	// Deleted counts the rows below the new log start that were (would be) deleted.
	Deleted int64 `json:"deleted"`
	// Compacted counts the rows compaction deleted (would delete).
	Compacted int64 `json:"compacted"`
	// LimitedBy names the live group whose committed offset held the log start back.
	LimitedBy string `json:"limited_by,omitempty"`
}

// StreamResult is what retention did to one stream.
type StreamResult struct {
	Stream     string            `json:"stream"`
	DryRun     bool              `json:"dry_run"`
	Partitions []PartitionResult `json:"partitions"`
}

// Deleted is the total of Deleted over the partitions.
func (s *StreamResult) Deleted() int64 {
	var n int64
	for _, p := range s.Partitions {
		n += p.Deleted
	}
	return n
}

// Compacted is the total of Compacted over the partitions.
func (s *StreamResult) Compacted() int64 {
	var n int64
	for _, p := range s.Partitions {
		n += p.Compacted
	}
	return n
}

// Apply applies stream's retention policy now, whether or not it is enabled. It
// fails with ErrNoPolicy when the stream has none, streams.ErrStreamNotFound when the
// stream does not exist, and ErrBusy when another runner is applying it (a dry run
// never waits for or blocks anyone). Each partition's log start moves in its own short
// transaction, then the rows below it go in transactions of at most BatchSize rows;
// compaction is one statement per partition. Returns what was deleted per partition;
// a dry run at the same Now reports the same counts. A run that fails part way returns
// its error with the result so far (the rows it deleted before the failure), or nil
// when it failed before deleting anything.
func (r *Runner) Apply(ctx context.Context, stream string, opts *ApplyOpts) (*StreamResult, error) {
	var o ApplyOpts
	if opts != nil {
		o = *opts
	}
	now := r.now(o.Now)
	if o.DryRun {
		res, err := plan(ctx, r.pool, stream, now, o.Force)
		if err != nil {
			return nil, fmt.Errorf("retention dry run of %s: %w", stream, err)
		}
		res.DryRun = true
		return res, nil
	}

	start := time.Now()
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("retention of %s: acquire connection: %w", stream, err)
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, hashtext($2))", lockClass, stream).Scan(&locked); err != nil {
		return nil, fmt.Errorf("retention of %s: lock: %w", stream, err)
	}
	if !locked {
		r.metrics.pass("busy", time.Since(start).Seconds(), 0, 0)
		return nil, fmt.Errorf("retention of %s: %w", stream, ErrBusy)
	}
	defer func() {
		// Unlock even after cancellation; a broken connection drops the lock anyway.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1, hashtext($2))", lockClass, stream); err != nil {
			conn.Conn().Close(uctx) // never hand a connection holding the lock back to the pool
		}
	}()

	res, err := r.apply(ctx, conn.Conn(), stream, now, o.Force)
	if err != nil {
		// The rows deleted before the failure are gone (each batch committed): count them.
		var deleted, compacted int64
		if res != nil {
			deleted, compacted = res.Deleted(), res.Compacted()
		}
		r.metrics.pass("error", time.Since(start).Seconds(), deleted, compacted)
		return res, fmt.Errorf("retention of %s: %w", stream, err)
	}
	r.metrics.pass("ok", time.Since(start).Seconds(), res.Deleted(), res.Compacted())
	return res, nil
}

func (r *Runner) now(t time.Time) *time.Time {
	if !t.IsZero() {
		return &t
	}
	if r.cfg.Now != nil {
		v := r.cfg.Now()
		return &v
	}
	return nil // the database's now()
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// plan is the dry run: streamd.apply_policy with p_dry_run.
func plan(ctx context.Context, db querier, stream string, now *time.Time, force bool) (*StreamResult, error) {
	rows, err := db.Query(ctx, `
		SELECT partition, log_start_offset, next_offset, new_log_start_offset, deleted, compacted, coalesce(limited_by, '')
		  FROM streamd.apply_policy($1, $2, $3, true)`, stream, now, force)
	if err != nil {
		return nil, sqlerr.Wrap(err)
	}
	parts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (PartitionResult, error) {
		var p PartitionResult
		err := row.Scan(&p.Partition, &p.LogStartOffset, &p.NextOffset, &p.NewLogStartOffset, &p.Deleted, &p.Compacted, &p.LimitedBy)
		return p, err
	})
	if err != nil {
		return nil, sqlerr.Wrap(err)
	}
	return &StreamResult{Stream: stream, Partitions: parts}, nil
}

// apply runs the plan in bounded steps on conn, which holds the stream's lock.
func (r *Runner) apply(ctx context.Context, conn *pgx.Conn, stream string, now *time.Time, force bool) (*StreamResult, error) {
	res, err := plan(ctx, conn, stream, now, force)
	if err != nil {
		return nil, err
	}
	var tombstoneSeconds int32
	if err := conn.QueryRow(ctx, `SELECT tombstone_retention_seconds FROM streamd.retention_policies WHERE stream_name = $1`,
		stream).Scan(&tombstoneSeconds); err != nil {
		return nil, sqlerr.Wrap(err)
	}
	// res says what was done, not what was planned: a failure part way returns it with
	// the rows deleted so far, and the partitions not reached unchanged.
	plans := make([]PartitionResult, len(res.Partitions))
	copy(plans, res.Partitions)
	for i := range res.Partitions {
		p := &res.Partitions[i]
		p.Deleted, p.Compacted, p.NewLogStartOffset = 0, 0, p.LogStartOffset
	}
	for i := range res.Partitions {
		p, planned := &res.Partitions[i], plans[i]
		if planned.Deleted > 0 || planned.NewLogStartOffset > planned.LogStartOffset {
			// Readers stop at the new log start as soon as this commits; the rows below
			// it then go in small transactions that lock no head row.
			if _, err := conn.Exec(ctx, "SELECT streamd.retention_advance($1, $2, $3)", stream, p.Partition, planned.NewLogStartOffset); err != nil {
				return res, sqlerr.Wrap(err)
			}
			p.NewLogStartOffset = planned.NewLogStartOffset
			for {
				var n int64
				if err := conn.QueryRow(ctx, "SELECT streamd.retention_delete_batch($1, $2, $3)",
					stream, p.Partition, r.cfg.BatchSize).Scan(&n); err != nil {
					return res, sqlerr.Wrap(err)
				}
				if n == 0 {
					break
				}
				p.Deleted += n
			}
		}
		if planned.Compacted > 0 {
			if err := conn.QueryRow(ctx, "SELECT streamd.compact_partition($1, $2, $3, $4, $5, false)",
				stream, p.Partition, planned.NewLogStartOffset, tombstoneSeconds, now).Scan(&p.Compacted); err != nil {
				return res, sqlerr.Wrap(err)
			}
		}
	}
	return res, nil
}

// nilIfEmpty: an empty Config.Streams means every stream, as nil does (sent as an
// empty array, it would match none).
func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// RunOnceOpts are RunOnce's knobs. A nil *RunOnceOpts means the defaults.
type RunOnceOpts struct {
	// DryRun and Force are as in ApplyOpts. Default to false.
	DryRun bool
	Force  bool
	// Now is as in ApplyOpts. Defaults to Config.Now, else the database's clock.
	Now time.Time
	// Report, when set, is called after each stream with its result (nil when nothing
	// was done) and its error: ErrBusy when another runner had it (skipped), another
	// error when it failed. It runs in RunOnce's goroutine. Defaults to nil.
	Report func(stream string, res *StreamResult, err error)
	// Streams applies exactly these streams, in this order, enabled or not (a stream
	// without a policy is an ErrNoPolicy failure), instead of Config.Streams' enabled
	// policies. Defaults to nil: the enabled policies.
	Streams []string
}

// RunOnce applies every enabled policy (or those of Config.Streams, or exactly
// opts.Streams) once, stream by stream, and returns what it did. Streams another
// runner is processing are skipped; a stream that fails is logged and the others still
// run; the errors are joined.
func (r *Runner) RunOnce(ctx context.Context, opts *RunOnceOpts) ([]*StreamResult, error) {
	var o RunOnceOpts
	if opts != nil {
		o = *opts
	}
	names, listed := o.Streams, len(o.Streams) == 0
	if listed {
		rows, err := r.pool.Query(ctx, `
			SELECT stream_name FROM streamd.retention_policies
			 WHERE enabled AND ($1::text[] IS NULL OR stream_name = ANY($1))
			 ORDER BY stream_name`, nilIfEmpty(r.cfg.Streams))
		if err != nil {
			return nil, fmt.Errorf("retention: list policies: %w", err)
		}
		if names, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return nil, fmt.Errorf("retention: list policies: %w", err)
		}
	}
	var (
		out  []*StreamResult
		errs []error
	)
	for _, name := range names {
		if ctx.Err() != nil {
			break
		}
		res, err := r.Apply(ctx, name, &ApplyOpts{DryRun: o.DryRun, Force: o.Force, Now: o.Now})
		switch {
		case errors.Is(err, ErrBusy):
			r.logger.Debug("retention skipped: another runner has the stream", "stream", name)
		case listed && errors.Is(err, ErrNoPolicy):
			continue // deleted since listed
		case err != nil:
			if ctx.Err() == nil {
				r.logger.Warn("retention failed", "stream", name, "error", err)
				errs = append(errs, err)
			}
		default:
			if res.Deleted() > 0 || res.Compacted() > 0 {
				r.logger.Debug("retention applied", "stream", name, "deleted", res.Deleted(), "compacted", res.Compacted())
			}
			out = append(out, res)
		}
		if o.Report != nil {
			o.Report(name, res, err)
		}
	}
	if err := ctx.Err(); err != nil {
		// Cut short (or its last stream was): the caller must not count the pass as
		// done (a coordinator slot stays open for the next leader).
		errs = append(errs, fmt.Errorf("retention: pass stopped: %w", err))
	}
	return out, errors.Join(errs...)
}

// Run applies the policies every Interval until ctx ends, then returns nil. Failures
// are logged and retried at the next pass. It runs in the calling goroutine and starts
// none.
func (r *Runner) Run(ctx context.Context) error {
	r.logger.Info("retention runner started", "interval", r.cfg.Interval, "batch_size", r.cfg.BatchSize)
	defer r.logger.Info("retention runner stopped")
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		_, _ = r.RunOnce(ctx, nil) // logged inside
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
