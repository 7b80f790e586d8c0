package messages

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/promreg"
)

// metrics are the queue's Prometheus collectors; the only label is the queue name.
type metrics struct {
	sent         *prometheus.CounterVec
	received     *prometheus.CounterVec
	acked        *prometheus.CounterVec
	nacked       *prometheus.CounterVec
	released     *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	leaseLost    *prometheus.CounterVec
	handlerTime  *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "streamd", Subsystem: "queue", Name: name, Help: help}, []string{"queue"})
	}
	m := &metrics{
		sent:         counter("sent_messages_total", "Messages stored by Send (duplicates excluded)."),
		received:     counter("received_messages_total", "Messages delivered by Receive."),
		acked:        counter("acked_messages_total", "Messages acked."),
		nacked:       counter("nacked_messages_total", "Messages nacked (made visible again)."),
		released:     counter("released_messages_total", "Messages released (visible again, the delivery attempt not spent)."),
		deadLettered: counter("dead_lettered_messages_total", "Messages moved to a dead-letter queue or discarded by Nack or Term."),
		leaseLost:    counter("lease_lost_total", "Settlements refused because the receipt was stale."),
		handlerTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "streamd", Subsystem: "queue", Name: "handler_duration_seconds",
			Help: "Time Work's handler took per message.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"queue"}),
	}
	// A second Client on reg shares the collectors.
	if err := errors.Join(promreg.Register(reg, &m.sent), promreg.Register(reg, &m.received),
		promreg.Register(reg, &m.acked), promreg.Register(reg, &m.nacked), promreg.Register(reg, &m.released),
		promreg.Register(reg, &m.deadLettered), promreg.Register(reg, &m.leaseLost),
		promreg.Register(reg, &m.handlerTime)); err != nil {
		return nil, err
	}
	return m, nil
}

// add adds n to v's queue counter. A count that is not positive adds nothing: a
// counter panics on a negative Add, and a settlement's metrics are counted after its
// transaction committed, so a miscount must not turn into a crash.
func (m *metrics) add(v *prometheus.CounterVec, queue string, n int) {
	if n <= 0 {
		return
	}
	v.WithLabelValues(queue).Add(float64(n))
}
