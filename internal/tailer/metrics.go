package tailer

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/promreg"
)

// Fallback reasons: why the tailer cannot run and polling is the only path. A fixed
// set, so the label stays bounded.
const (
	ReasonWalLevel    = "wal_level"   // wal_level is not logical
	ReasonPrivilege   = "privilege"   // the role may not open a replication connection
	ReasonPublication = "publication" // the publication is missing and may not be created
)

var reasons = []string{ReasonWalLevel, ReasonPrivilege, ReasonPublication}

type metrics struct {
	connected    prometheus.Gauge
	fallback     *prometheus.GaugeVec
	lagBytes     prometheus.Gauge
	delay        prometheus.Histogram
	transactions prometheus.Counter
	reconnects   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "streamd_tailer_connected",
			Help: "1 while the tailer streams from its replication slot, else 0.",
		}),
		fallback: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "streamd_tailer_fallback_polling",
			Help: "1 for the reason the tailer cannot run (wake-ups come from polling alone), else 0.",
		}, []string{"reason"}),
		lagBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "streamd_tailer_lag_bytes",
			Help: "WAL the server has written (pg_current_wal_lsn) past the last position the tailer handled, sampled every status interval.",
		}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "streamd_tailer_delay_seconds",
			Help:    "Time from a transaction's commit on the server to the tailer handing it on.",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 5},
		}),
		transactions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "streamd_tailer_transactions_total",
			Help: "Committed transactions with inserts into events or messages handed on.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "streamd_tailer_reconnects_total",
			Help: "Times the tailer lost or could not open its replication connection.",
		}),
	}
	for _, r := range reasons {
		m.fallback.WithLabelValues(r).Set(0)
	}
	if err := errors.Join(promreg.Register(reg, &m.connected), promreg.Register(reg, &m.fallback),
		promreg.Register(reg, &m.lagBytes), promreg.Register(reg, &m.delay),
		promreg.Register(reg, &m.transactions), promreg.Register(reg, &m.reconnects)); err != nil {
		return nil, fmt.Errorf("tailer: %w", err)
	}
	return m, nil
}

// setFallback marks reason as the one in effect ("" clears all).
func (m *metrics) setFallback(reason string) {
	for _, r := range reasons {
		v := 0.0
		if r == reason {
			v = 1
		}
		m.fallback.WithLabelValues(r).Set(v)
	}
}
