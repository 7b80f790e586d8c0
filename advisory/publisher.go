package advisory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/promreg"
)

// Advisory is one advisory a Publisher writes.
type Advisory struct {
	// Type is one of the Type constants.
	Type string
	// Key is the subject (see the package documentation).
	Key string
	// Data is the payload, marshalled to JSON (the struct its Type names).
	Data any
}

// Config configures a Publisher. Fields are alphabetical.
type Config struct {
	// Buffer is how many advisories wait to be written at most; Publish drops (and
	// counts) what comes while it is full. Defaults to 256.
	Buffer int
	// Logger receives a warning for each advisory dropped. Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the publisher's metrics. Defaults to nil: no metrics.
	Registerer prometheus.Registerer
	// WriteTimeout bounds the write of one advisory; one that fails or times out is
	// dropped (and counted), not retried. Defaults to 5s.
	WriteTimeout time.Duration
}

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Buffer == 0 {
		out.Buffer = 256
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.WriteTimeout == 0 {
		out.WriteTimeout = 5 * time.Second
	}
	switch {
	case out.Buffer < 0:
		return out, fmt.Errorf("advisory: Config.Buffer %d is negative", out.Buffer)
	case out.WriteTimeout < 0:
		return out, fmt.Errorf("advisory: Config.WriteTimeout %v is negative", out.WriteTimeout)
	}
	return out, nil
}

// Publisher writes the advisories of facts that happen in Go (the tailer's, the
// elector's) to the advisory stream, from one goroutine (Run), so that reporting never blocks the
// reporter. A nil *Publisher is valid and publishes nothing.
type Publisher struct {
	pool    *pgxpool.Pool
	cfg     Config
	ch      chan Advisory
	written prometheus.Counter
	dropped *prometheus.CounterVec
}

// New returns a Publisher writing through pool. It writes nothing until Run.
func New(pool *pgxpool.Pool, cfg *Config) (*Publisher, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, errors.New("advisory: New: pool is required")
	}
	p := &Publisher{pool: pool, cfg: c, ch: make(chan Advisory, c.Buffer),
		written: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "streamd_advisory_published_total",
			Help: "Advisories of Go-side facts (the tailer's, the elector's) written to the advisory stream.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "streamd_advisory_dropped_total",
			Help: "Advisories of Go-side facts not written: reason full (the buffer was full) or error (the write failed).",
		}, []string{"reason"}),
	}
	p.dropped.WithLabelValues("full")
	p.dropped.WithLabelValues("error")
	if err := errors.Join(promreg.Register(c.Registerer, &p.written), promreg.Register(c.Registerer, &p.dropped)); err != nil {
		return nil, fmt.Errorf("advisory: %w", err)
	}
	return p, nil
}

// Publish queues a for writing and returns at once: true when queued, false when the
// buffer was full (a dropped advisory is counted and logged). Safe for concurrent use.
func (p *Publisher) Publish(a Advisory) bool {
	if p == nil {
		return false
	}
	select {
	case p.ch <- a:
		return true
	default:
		p.dropped.WithLabelValues("full").Inc()
		p.cfg.Logger.Warn("advisory dropped: buffer full", "type", a.Type, "key", a.Key)
		return false
	}
}

// Run writes queued advisories, one statement each, until ctx ends, and returns nil
// then (what is still queued is dropped). One that fails is dropped and counted: an
// advisory is a report, and retrying could hold back the ones behind it. Run must not
// be called concurrently with itself.
func (p *Publisher) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case a := <-p.ch:
			if err := p.write(ctx, a); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				p.dropped.WithLabelValues("error").Inc()
				p.cfg.Logger.Warn("advisory dropped: write failed", "type", a.Type, "key", a.Key, "error", err)
				continue
			}
			p.written.Inc()
		}
	}
}

func (p *Publisher) write(ctx context.Context, a Advisory) error {
	data, err := json.Marshal(a.Data)
	if err != nil {
		return fmt.Errorf("marshal %s: %w", a.Type, err)
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.WriteTimeout)
	defer cancel()
	_, err = p.pool.Exec(wctx, "SELECT streamd.advise($1, $2, $3)", a.Type, a.Key, data)
	return err
}
