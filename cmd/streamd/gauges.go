package main

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/promreg"
	"github.com/streamd/streamd/messages"
)

// gauges are the fleet-wide figures the leader refreshes from the monitoring views:
// consumer lag per group partition and queue depths. Followers export none (they
// reset when a term ends), so a dashboard sums over instances without double counts.
type gauges struct {
	groups    *consumergroup.Admin
	queues    *messages.Client
	lag       *prometheus.GaugeVec
	depth     *prometheus.GaugeVec
	inFlight  *prometheus.GaugeVec
	delayed   *prometheus.GaugeVec
	oldestAge *prometheus.GaugeVec
	// lastUpdate has no labels; a vector so that a follower exports no series (a
	// stale timestamp on followers made a freshness alert fire on them).
	lastUpdate *prometheus.GaugeVec
}

func newGauges(groups *consumergroup.Admin, queues *messages.Client, reg prometheus.Registerer) (*gauges, error) {
	g := &gauges{
		groups: groups,
		queues: queues,
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "streamd_group_lag_records",
			Help: "Consumer lag: log end minus committed offset, per group partition (leader only)."},
			[]string{"stream", "group", "partition"}),
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "streamd_queue_depth_messages",
			Help: "Visible messages per queue (leader only)."}, []string{"queue"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "streamd_queue_in_flight_messages",
			Help: "Leased messages per queue (leader only)."}, []string{"queue"}),
		delayed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "streamd_queue_delayed_messages",
			Help: "Delayed or nacked messages not yet visible, per queue (leader only)."}, []string{"queue"}),
		oldestAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "streamd_queue_oldest_message_age_seconds",
			Help: "Age of the oldest message per queue (leader only)."}, []string{"queue"}),
		lastUpdate: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "streamd_coordinator_gauges_updated_timestamp_seconds",
			Help: "When the leader last refreshed the lag and queue gauges (leader only)."}, nil),
	}
	if err := errors.Join(promreg.Register(reg, &g.lag), promreg.Register(reg, &g.depth),
		promreg.Register(reg, &g.inFlight), promreg.Register(reg, &g.delayed),
		promreg.Register(reg, &g.oldestAge), promreg.Register(reg, &g.lastUpdate)); err != nil {
		return nil, err
	}
	return g, nil
}

// refresh reads the lags and the queue statistics once and replaces every series.
func (g *gauges) refresh(ctx context.Context) error {
	lags, err := g.groups.Lags(ctx)
	if err != nil {
		return err
	}
	queues, err := g.queues.Stats(ctx, "")
	if err != nil {
		return err
	}
	g.lag.Reset()
	for _, r := range lags {
		g.lag.WithLabelValues(r.Stream, r.Group, strconv.Itoa(int(r.Partition))).Set(float64(r.Lag))
	}
	g.depth.Reset()
	g.inFlight.Reset()
	g.delayed.Reset()
	g.oldestAge.Reset()
	for _, q := range queues {
		g.depth.WithLabelValues(q.Queue).Set(float64(q.Depth))
		g.inFlight.WithLabelValues(q.Queue).Set(float64(q.InFlight))
		g.delayed.WithLabelValues(q.Queue).Set(float64(q.Delayed))
		g.oldestAge.WithLabelValues(q.Queue).Set(q.OldestAge.Seconds())
	}
	g.lastUpdate.WithLabelValues().SetToCurrentTime()
	return nil
}

// clear drops every series: a follower exports none.
func (g *gauges) clear() {
	g.lag.Reset()
	g.depth.Reset()
	g.inFlight.Reset()
	g.delayed.Reset()
	g.oldestAge.Reset()
	g.lastUpdate.Reset()
}

// run refreshes every interval until ctx ends (the term), then clears.
func (g *gauges) run(interval time.Duration) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		defer g.clear()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if err := g.refresh(ctx); err != nil && ctx.Err() == nil {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}
}
