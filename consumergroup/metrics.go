package consumergroup

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the consumer's Prometheus collectors. Labels are bounded: stream, group,
// partition (bounded by the stream's partition count) and a fixed set of reasons;
// never member ids or offsets.
type metrics struct {
	batchDuration *prometheus.HistogramVec
	deadLettered  *prometheus.CounterVec
	fencedCommits *prometheus.CounterVec
	handlerErrors *prometheus.CounterVec
	lag           *prometheus.GaugeVec
	offsetResets  *prometheus.CounterVec
	rebalances    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		batchDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "streamd_consumergroup_batch_duration_seconds", Help: "Time from a batch's handler call to its offset commit.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}, []string{"stream", "group"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "streamd_consumergroup_dead_lettered_total", Help: "Events moved to the dead letter queue after their handler kept failing.",
		}, []string{"stream", "group"}),
		fencedCommits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "streamd_consumergroup_fenced_commits_total", Help: "Offset commits refused because the member no longer owned the partition at its epoch.",
		}, []string{"stream", "group"}),
		handlerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "streamd_consumergroup_handler_errors_total", Help: "Handler calls that returned an error.",
		}, []string{"stream", "group"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "streamd_consumergroup_lag_records", Help: "Log end minus this member's position, per owned partition.",
		}, []string{"stream", "group", "partition"}),
		offsetResets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "streamd_consumergroup_offset_resets_total", Help: "Start positions taken from the reset policy or clamped to the log (reason: no_commit, below_log_start, past_log_end).",
		}, []string{"stream", "group", "reason"}),
		rebalances: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "streamd_consumergroup_rebalances_total", Help: "Assignment changes seen by this member, by reason (assigned, revoked, lost, fenced, poll_timeout).",
		}, []string{"stream", "group", "reason"}),
	}
	if reg == nil {
		return m
	}
	m.batchDuration = register(reg, m.batchDuration)
	m.deadLettered = register(reg, m.deadLettered)
	m.fencedCommits = register(reg, m.fencedCommits)
	m.handlerErrors = register(reg, m.handlerErrors)
	m.lag = register(reg, m.lag)
	m.offsetResets = register(reg, m.offsetResets)
	m.rebalances = register(reg, m.rebalances)
	return m
}

// register registers c, or returns the collector already registered under its name
// (several Consumers in one process share one registry).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err)
	}
	return c
}
