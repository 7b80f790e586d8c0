package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// gauges are the fleet-wide figures the leader refreshes from the monitoring views:
// consumer lag per group partition and queue depths. Followers export none (they
// reset when a term ends), so a dashboard sums over instances without double counts.
type gauges struct {
	pool      *pgxpool.Pool
	lag       *prometheus.GaugeVec
	depth     *prometheus.GaugeVec
	inFlight  *prometheus.GaugeVec
	delayed   *prometheus.GaugeVec
	oldestAge *prometheus.GaugeVec
	// lastUpdate has no labels; a vector so that a follower exports no series (a
	// stale timestamp on followers made a freshness alert fire on them).
	lastUpdate *prometheus.GaugeVec
}

func newGauges(pool *pgxpool.Pool, reg prometheus.Registerer) *gauges {
	g := &gauges{
		pool: pool,
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
	reg.MustRegister(g.lag, g.depth, g.inFlight, g.delayed, g.oldestAge, g.lastUpdate)
	return g
}

// refresh reads the views once and replaces every series.
func (g *gauges) refresh(ctx context.Context) error {
	rows, err := g.pool.Query(ctx, `SELECT stream_name, group_id, partition, lag FROM streamd.consumer_group_status WHERE partition IS NOT NULL`)
	if err != nil {
		return fmt.Errorf("read consumer_group_status: %w", err)
	}
	type lagRow struct {
		stream, group string
		partition     int32
		lag           int64
	}
	var lags []lagRow
	for rows.Next() {
		var r lagRow
		if err := rows.Scan(&r.stream, &r.group, &r.partition, &r.lag); err != nil {
			rows.Close()
			return err
		}
		lags = append(lags, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	type queueRow struct {
		name                     string
		depth, inFlight, delayed int64
		oldest                   *time.Time
	}
	var queues []queueRow
	rows, err = g.pool.Query(ctx, `SELECT queue_name, depth, in_flight, delayed, oldest_enqueued_at FROM streamd.queue_stats(NULL, NULL)`)
	if err != nil {
		return fmt.Errorf("read queue_stats: %w", err)
	}
	for rows.Next() {
		var r queueRow
		if err := rows.Scan(&r.name, &r.depth, &r.inFlight, &r.delayed, &r.oldest); err != nil {
			rows.Close()
			return err
		}
		queues = append(queues, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}

	g.lag.Reset()
	for _, r := range lags {
		g.lag.WithLabelValues(r.stream, r.group, strconv.Itoa(int(r.partition))).Set(float64(r.lag))
	}
	g.depth.Reset()
	g.inFlight.Reset()
	g.delayed.Reset()
	g.oldestAge.Reset()
	now := time.Now()
	for _, q := range queues {
		g.depth.WithLabelValues(q.name).Set(float64(q.depth))
		g.inFlight.WithLabelValues(q.name).Set(float64(q.inFlight))
		g.delayed.WithLabelValues(q.name).Set(float64(q.delayed))
		age := 0.0
		if q.oldest != nil {
			age = now.Sub(*q.oldest).Seconds()
		}
		g.oldestAge.WithLabelValues(q.name).Set(age)
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
