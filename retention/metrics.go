package retention

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/promreg"
)

// metrics are the runner's Prometheus series; a nil *metrics records nothing.
type metrics struct {
	deleted  *prometheus.CounterVec
	passes   *prometheus.CounterVec
	duration prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "streamd_retention_deleted_events_total",
			Help: "Events deleted by retention, by kind (delete: below the log start; compact: superseded or old tombstones).",
		}, []string{"kind"}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "streamd_retention_passes_total",
			Help: "Retention passes over one stream, by result (ok, busy: another runner had it, error).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "streamd_retention_pass_duration_seconds",
			Help:    "Time to apply retention to one stream.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
	}
	if err := errors.Join(promreg.Register(reg, &m.deleted), promreg.Register(reg, &m.passes),
		promreg.Register(reg, &m.duration)); err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	return m, nil
}

func (m *metrics) pass(result string, seconds float64, deleted, compacted int64) {
	if m == nil {
		return
	}
	m.passes.WithLabelValues(result).Inc()
	m.duration.Observe(seconds)
	m.deleted.WithLabelValues("delete").Add(float64(deleted))
	m.deleted.WithLabelValues("compact").Add(float64(compacted))
}
