package eventstore

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/promreg"
)

// metrics are the store's counters; nil when Config.Registerer is nil.
type metrics struct {
	appends *prometheus.CounterVec
	opens   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		appends: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "streamd_eventstore_appends_total",
			Help: "Event store appends by result: ok, version_mismatch, session (not open, expired, held), error."}, []string{"result"}),
		opens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "streamd_eventstore_session_opens_total",
			Help: "Session opens by result: ok, timeout, error."}, []string{"result"}),
	}
	if err := errors.Join(promreg.Register(reg, &m.appends), promreg.Register(reg, &m.opens)); err != nil {
		return nil, fmt.Errorf("eventstore: %w", err)
	}
	return m, nil
}

func (m *metrics) append(err error) {
	if m == nil {
		return
	}
	result := "ok"
	switch {
	case err == nil:
	case errors.Is(err, ErrVersionMismatch):
		result = "version_mismatch"
	case errors.Is(err, ErrNotOpen), errors.Is(err, ErrSessionExpired), errors.Is(err, ErrSessionHeld):
		result = "session"
	default:
		result = "error"
	}
	m.appends.WithLabelValues(result).Inc()
}

func (m *metrics) open(err error) {
	if m == nil {
		return
	}
	result := "ok"
	switch {
	case err == nil:
	case errors.Is(err, ErrOpenTimeout):
		result = "timeout"
	default:
		result = "error"
	}
	m.opens.WithLabelValues(result).Inc()
}
