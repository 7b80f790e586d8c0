// Package coordinator elects one streamd instance as the leader and runs the
// coordinator jobs (retention, the stale-member reaper, the tailer's re-broadcast,
// lag metrics, redrive) on it alone.
//
// Leadership is a lease row (streamd.leader_leases) with an epoch that grows with
// every change of holder. The leader renews it every RenewInterval; an instance that
// cannot renew before the lease expires stops its jobs (it may already be deposed),
// and a successor takes over once the lease expired, or at once when the leader
// released it on a clean shutdown. Job runs are recorded per schedule slot and fenced
// by the epoch (streamd.start_coordinator_run), so each slot of each job finishes
// exactly once across instances.
package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/advisory"
	"github.com/streamd/streamd/internal/promreg"
)

// ElectorConfig configures an Elector. A nil *ElectorConfig means the defaults.
type ElectorConfig struct {
	// Advisories receives an advisory.TypeLeaderChanged each time this instance takes
	// the lease (a new term); publishing never blocks the elector. Defaults to nil:
	// none.
	Advisories *advisory.Publisher
	// Holder identifies this instance in the lease. Defaults to hostname-pid-random.
	Holder string
	// LeaseName names the lease. Defaults to "streamd-coordinator".
	LeaseName string
	// LeaseTTL is how long a lease lasts without renewal: the longest a dead leader
	// keeps others waiting. Defaults to 5s.
	LeaseTTL time.Duration
	// Logger receives lifecycle lines (elected, deposed). Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer registers streamd_coordinator_is_leader. Defaults to nil: none.
	Registerer prometheus.Registerer
	// RenewInterval is how often the lease is renewed, and how often a follower tries
	// to take it. Defaults to LeaseTTL/5.
	RenewInterval time.Duration
}

func (c *ElectorConfig) withDefaults() (ElectorConfig, error) {
	out := ElectorConfig{}
	if c != nil {
		out = *c
	}
	if out.Holder == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		out.Holder = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	if out.LeaseName == "" {
		out.LeaseName = "streamd-coordinator"
	}
	if out.LeaseTTL == 0 {
		out.LeaseTTL = 5 * time.Second
	}
	if out.LeaseTTL < 100*time.Millisecond {
		return out, fmt.Errorf("coordinator: ElectorConfig.LeaseTTL %v is below 100ms", out.LeaseTTL)
	}
	if out.LeaseTTL > math.MaxInt32*time.Millisecond {
		// The lease functions take milliseconds as an integer: a longer TTL wrapped
		// around to a negative one, every lease was born expired, and every instance
		// led at once.
		return out, fmt.Errorf("coordinator: ElectorConfig.LeaseTTL %v is over %v", out.LeaseTTL, math.MaxInt32*time.Millisecond)
	}
	if out.RenewInterval == 0 {
		out.RenewInterval = out.LeaseTTL / 5
	}
	if out.RenewInterval <= 0 || out.RenewInterval >= out.LeaseTTL {
		return out, fmt.Errorf("coordinator: ElectorConfig.RenewInterval %v must be positive and below LeaseTTL %v", out.RenewInterval, out.LeaseTTL)
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, nil
}

// Leadership is one term of leadership, handed to the function Run calls.
type Leadership struct {
	Lease  string
	Holder string
	Epoch  int64
}

// Elector campaigns for the lease and runs a function while it holds it.
type Elector struct {
	pool     *pgxpool.Pool
	cfg      ElectorConfig
	isLeader prometheus.Gauge

	mu      sync.Mutex
	current *Leadership
}

// NewElector returns an Elector on pool.
func NewElector(pool *pgxpool.Pool, cfg *ElectorConfig) (*Elector, error) {
	conf, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	e := &Elector{pool: pool, cfg: conf, isLeader: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "streamd_coordinator_is_leader", Help: "1 while this instance holds the coordinator lease."})}
	if err := promreg.Register(conf.Registerer, &e.isLeader); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	return e, nil
}

// Holder returns this instance's holder id.
func (e *Elector) Holder() string { return e.cfg.Holder }

// Current returns the leadership held now, or nil.
func (e *Elector) Current() *Leadership {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.current == nil {
		return nil
	}
	l := *e.current
	return &l
}

// Run campaigns until ctx ends. Each time it becomes leader it calls lead in a new
// goroutine with a context that is cancelled when leadership ends (lost renewal, or
// ctx ended), and waits for lead to return before campaigning again. On return it
// releases the lease so a successor takes over at once. Run returns nil after ctx
// ended.
//
// Concurrency: lead is never called concurrently with itself.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context, l Leadership)) error {
	ticker := time.NewTicker(e.cfg.RenewInterval)
	defer ticker.Stop()
	var (
		leaderCancel context.CancelFunc
		leaderDone   chan struct{}
		held         *Leadership
		lastRenewal  time.Time
		watchdog     *time.Timer
	)
	// The watchdog ends the term before the lease can expire without a renewal, even
	// when the loop below is stuck in a slow renewal: a successor may take the lease
	// at expiry, and two leaders must not work at once.
	safeFor := e.cfg.LeaseTTL - e.cfg.RenewInterval/2
	stepDown := func(reason string) {
		if held == nil {
			return
		}
		watchdog.Stop()
		leaderCancel()
		<-leaderDone
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		var released bool
		if err := e.pool.QueryRow(rctx, "SELECT streamd.release_lease($1, $2, $3)", held.Lease, held.Holder, held.Epoch).Scan(&released); err != nil {
			e.cfg.Logger.Warn("release lease failed", "lease", held.Lease, "err", err)
		}
		e.cfg.Logger.Info("coordinator leadership ended", "lease", held.Lease, "epoch", held.Epoch, "reason", reason)
		e.mu.Lock()
		e.current = nil
		e.mu.Unlock()
		e.isLeader.Set(0)
		held = nil
	}
	defer stepDown("shutdown")

	for {
		attempt := time.Now()
		epoch, err := e.acquire(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			e.cfg.Logger.Warn("lease renewal failed", "lease", e.cfg.LeaseName, "err", err)
			// Without a renewal the lease may expire under us: stop before it does.
			if held != nil && time.Since(lastRenewal) > e.cfg.LeaseTTL-e.cfg.RenewInterval {
				stepDown("renewal failed")
			}
		case epoch == 0:
			if held != nil {
				stepDown("lease lost")
			}
		case held != nil && epoch != held.Epoch:
			// Someone else held it in between: our term ended.
			stepDown("epoch changed")
			fallthrough
		case held == nil:
			held = &Leadership{Lease: e.cfg.LeaseName, Holder: e.cfg.Holder, Epoch: epoch}
			lastRenewal = attempt
			e.mu.Lock()
			e.current = held
			e.mu.Unlock()
			e.isLeader.Set(1)
			e.cfg.Logger.Info("coordinator leadership acquired", "lease", held.Lease, "epoch", epoch, "holder", held.Holder)
			e.cfg.Advisories.Publish(advisory.Advisory{Type: advisory.TypeLeaderChanged, Key: held.Lease,
				Data: advisory.LeaderChanged{Lease: held.Lease, Holder: held.Holder, Epoch: epoch, At: time.Now()}})
			var lctx context.Context
			lctx, leaderCancel = context.WithCancel(ctx)
			leaderDone = make(chan struct{})
			watchdog = time.AfterFunc(time.Until(lastRenewal.Add(safeFor)), leaderCancel)
			go func(l Leadership) {
				defer close(leaderDone)
				lead(lctx, l)
			}(*held)
		default:
			lastRenewal = attempt
			watchdog.Reset(time.Until(lastRenewal.Add(safeFor)))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-leaderDoneOrNil(held, leaderDone):
			// lead returned on its own: end the term; the next round campaigns again.
			stepDown("lead returned")
		case <-ticker.C:
		}
	}
}

func leaderDoneOrNil(held *Leadership, done chan struct{}) <-chan struct{} {
	if held == nil || done == nil {
		return nil
	}
	return done
}

func (e *Elector) acquire(ctx context.Context) (int64, error) {
	actx, cancel := context.WithTimeout(ctx, e.cfg.RenewInterval)
	defer cancel()
	var epoch *int64
	err := e.pool.QueryRow(actx, "SELECT streamd.acquire_lease($1, $2, $3)",
		e.cfg.LeaseName, e.cfg.Holder, int32(e.cfg.LeaseTTL/time.Millisecond)).Scan(&epoch)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return 0, fmt.Errorf("acquire lease: timed out after %v", e.cfg.RenewInterval)
		}
		return 0, err
	}
	if epoch == nil {
		return 0, nil
	}
	return *epoch, nil
}
