package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/backoff"
	"github.com/streamd/streamd/internal/promreg"
)

// Job is a coordinator job: run on the leader once per Interval-long schedule slot.
type Job struct {
	// Name identifies the job in streamd.coordinator_runs and in metrics.
	Name string
	// Interval is the length of a schedule slot. Slots are aligned to the Unix epoch,
	// so every instance agrees on them.
	Interval time.Duration
	// Run does one slot's work. It must be idempotent: a successor re-runs a slot that
	// a deposed leader started but did not finish. Its ctx ends when leadership ends.
	Run func(ctx context.Context) error
}

// Continuous is a coordinator service that runs for the whole term (the tailer and
// its re-broadcast): Run is called once per term and must return when ctx ends.
type Continuous struct {
	Name string
	Run  func(ctx context.Context) error
}

// Jobs runs jobs and services during a term of leadership.
type Jobs struct {
	pool       *pgxpool.Pool
	logger     *slog.Logger
	jobs       []Job
	services   []Continuous
	runs       *prometheus.CounterVec
	now        func() time.Time
	retryAfter time.Duration
}

// JobsConfig configures a Jobs. A nil *JobsConfig means the defaults (no jobs, no
// services).
type JobsConfig struct {
	// Jobs run once per schedule slot across instances. Each needs a name, a positive
	// interval and a Run func. Defaults to none.
	Jobs []Job
	// Logger receives the jobs' log lines. Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives streamd_coordinator_job_runs_total. Defaults to nil: no
	// metrics.
	Registerer prometheus.Registerer
	// Services run for the whole term. Defaults to none.
	Services []Continuous
}

func (c *JobsConfig) withDefaults() (JobsConfig, error) {
	var out JobsConfig
	if c != nil {
		out = *c
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, out.validate()
}

func (c *JobsConfig) validate() error {
	for i, j := range c.Jobs {
		if j.Name == "" || j.Interval <= 0 || j.Run == nil {
			return fmt.Errorf("coordinator: JobsConfig.Jobs[%d] (%q) needs a name, a positive interval and a Run func", i, j.Name)
		}
	}
	return nil
}

// NewJobs returns a runner for cfg's jobs and services. It fails when cfg is invalid,
// naming the field.
func NewJobs(pool *pgxpool.Pool, cfg *JobsConfig) (*Jobs, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	runs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "streamd_coordinator_job_runs_total", Help: "Coordinator job runs by job and result (ok, error)."},
		[]string{"job", "result"})
	if err := promreg.Register(c.Registerer, &runs); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	return &Jobs{pool: pool, logger: c.Logger, jobs: c.Jobs, services: c.Services, runs: runs, now: time.Now, retryAfter: time.Second}, nil
}

// Lead runs every job and service until ctx ends; it is the function to hand to
// Elector.Run. One goroutine per job and per service, all joined before it returns.
func (j *Jobs) Lead(ctx context.Context, l Leadership) {
	var wg sync.WaitGroup
	for _, job := range j.jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j.runJob(ctx, l, job)
		}()
	}
	for _, svc := range j.services {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := svc.Run(ctx); err != nil && ctx.Err() == nil {
					j.logger.Warn("coordinator service failed; restarting", "service", svc.Name, "err", err)
					select {
					case <-ctx.Done():
					case <-time.After(j.retryAfter):
					}
				}
			}
		}()
	}
	wg.Wait()
}

// runJob runs job once per slot: at the start of the term for the current slot (if it
// has not finished yet), then at the start of each following slot.
func (j *Jobs) runJob(ctx context.Context, l Leadership, job Job) {
	for {
		now := j.now()
		slot := now.UnixNano() / int64(job.Interval)
		next := time.Unix(0, (slot+1)*int64(job.Interval))
		// A slot whose start could not be recorded (a connection lost to a database
		// restart, a timeout) is tried again within the slot, not skipped.
		for bo := backoff.New(j.retryAfter, 30*time.Second); !j.runSlot(ctx, l, job, slot) && ctx.Err() == nil; {
			wait := bo.Next()
			if j.now().Add(wait).After(next) {
				break
			}
			if !backoff.Sleep(ctx, wait) {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next.Sub(j.now())):
		}
	}
}

// runSlot runs job for slot unless it ran already; it returns false when the slot's
// start could not be recorded (the caller tries again).
func (j *Jobs) runSlot(ctx context.Context, l Leadership, job Job, slot int64) bool {
	var started bool
	err := j.pool.QueryRow(ctx, "SELECT streamd.start_coordinator_run($1, $2, $3, $4, $5)",
		job.Name, slot, l.Lease, l.Holder, l.Epoch).Scan(&started)
	if err != nil {
		if ctx.Err() == nil {
			j.logger.Warn("start coordinator run failed; trying again", "job", job.Name, "err", err)
		}
		return false
	}
	if !started {
		return true // finished already, or no longer leader
	}
	runErr := job.Run(ctx)
	result, msg := "ok", (*string)(nil)
	if runErr != nil {
		result = "error"
		s := runErr.Error()
		msg = &s
		j.logger.Warn("coordinator job failed", "job", job.Name, "slot", slot, "err", runErr)
	}
	if ctx.Err() != nil && runErr != nil {
		return true // deposed mid-run: the successor re-runs this slot
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := j.pool.Exec(fctx, "SELECT streamd.finish_coordinator_run($1, $2, $3, $4)", job.Name, slot, l.Epoch, msg); err != nil {
		j.logger.Warn("finish coordinator run failed", "job", job.Name, "err", err)
		return true
	}
	j.runs.WithLabelValues(job.Name, result).Inc()
	return true
}
