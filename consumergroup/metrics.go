package consumergroup

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/internal/promreg"
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

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		batchDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "streamd_consumergroup_batch_duration_seconds", Help: "Time from a batch's handler call until its offset is handed to the committer (CommitAuto) or committed.",
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
	// Several Consumers in one process share one registry: a second registration
	// shares the collectors.
	if err := errors.Join(promreg.Register(reg, &m.batchDuration), promreg.Register(reg, &m.deadLettered),
		promreg.Register(reg, &m.fencedCommits), promreg.Register(reg, &m.handlerErrors),
		promreg.Register(reg, &m.lag), promreg.Register(reg, &m.offsetResets),
		promreg.Register(reg, &m.rebalances)); err != nil {
		return nil, fmt.Errorf("consumergroup: %w", err)
	}
	return m, nil
}
