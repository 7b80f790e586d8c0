package streams

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/promreg"
)

type producerMetrics struct {
	records  prometheus.Counter
	batches  prometheus.Counter
	failures prometheus.Counter
	retries  prometheus.Counter
	size     prometheus.Histogram
	duration prometheus.Histogram
}

// newProducerMetrics creates the producer's metrics and registers them on reg (nil:
// created but not registered, so the code needs no nil checks).
func newProducerMetrics(reg prometheus.Registerer) (*producerMetrics, error) {
	m := &producerMetrics{
		records: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "streamd_producer_records_total", Help: "Records appended by the producer (committed)."}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "streamd_producer_batches_total", Help: "Append transactions committed by the producer."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "streamd_producer_batch_failures_total", Help: "Batches that failed after retries; their records got the error."}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "streamd_producer_retries_total", Help: "Append attempts retried after a retriable error."}),
		size: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "streamd_producer_batch_records", Help: "Records per append transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 7)}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "streamd_producer_append_duration_seconds", Help: "Time to append one batch, retries included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
	// A second Producer on reg shares the collectors: the counts are the process's.
	if err := errors.Join(promreg.Register(reg, &m.records), promreg.Register(reg, &m.batches),
		promreg.Register(reg, &m.failures), promreg.Register(reg, &m.retries),
		promreg.Register(reg, &m.size), promreg.Register(reg, &m.duration)); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *producerMetrics) observeBatch(n int, d time.Duration, err error) {
	if err != nil {
		m.failures.Inc()
		return
	}
	m.records.Add(float64(n))
	m.batches.Inc()
	m.size.Observe(float64(n))
	m.duration.Observe(d.Seconds())
}
