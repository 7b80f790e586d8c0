package kafka

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// metrics are the server's Prometheus metrics; the api label is bounded by the
// handler table.
type metrics struct {
	connections prometheus.Gauge
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	malformed   prometheus.Counter
	// saslFailures counts failed SASL authentications (each closed its connection).
	saslFailures prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connections: prometheus.NewGauge(prometheus.GaugeOpts{Name: "streamd_kafka_connections",
			Help: "Open Kafka client connections."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "streamd_kafka_requests_total",
			Help: "Kafka requests answered, by API and outcome (ok, error: the connection was closed)."}, []string{"api", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "streamd_kafka_request_duration_seconds",
			Help:    "Time to answer a Kafka request (long polls included), by API.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 9)}, []string{"api"}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{Name: "streamd_kafka_rejected_frames_total",
			Help: "Frames that closed their connection: malformed, oversized, unknown API key or version, or sent before SASL authentication."}),
		saslFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "streamd_kafka_sasl_failures_total",
			Help: "Failed Kafka SASL authentications (bad credentials or exchange); each closed its connection."}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.connections, m.requests, m.duration, m.malformed, m.saslFailures} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				continue
			}
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observe(key int16, d time.Duration, err error) {
	api := kmsg.NameForKey(key)
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.requests.WithLabelValues(api, outcome).Inc()
	m.duration.WithLabelValues(api).Observe(d.Seconds())
}
