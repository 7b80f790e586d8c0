package main

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/cmd/streamd/internal/coordinator"
	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
	"github.com/streamd/streamd/retention"
	"github.com/streamd/streamd/streams"
	"github.com/streamd/streamd/wakeup"
)

// recorder is a Registerer that remembers the names of the metrics registered on it.
type recorder struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return true }

// TestGrafanaDashboardUsesRealMetrics: the dashboard is valid JSON and every streamd_
// metric its queries name is one that some component registers, so a renamed metric
// cannot leave an empty panel behind.
func TestGrafanaDashboardUsesRealMetrics(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	rec := &recorder{names: map[string]bool{"streamd_up": true}}
	_, err := streams.NewProducer(pool, &streams.ProducerConfig{Registerer: rec})
	require.NoError(t, err)
	_, err = consumergroup.New(pool, &consumergroup.Config{Stream: "s", Group: "g", Registerer: rec})
	require.NoError(t, err)
	_, err = messages.NewClient(pool, &messages.ClientConfig{Registerer: rec})
	require.NoError(t, err)
	_, err = retention.New(pool, &retention.Config{Registerer: rec})
	require.NoError(t, err)
	_, err = coordinator.NewElector(pool, &coordinator.ElectorConfig{Registerer: rec})
	require.NoError(t, err)
	_, err = coordinator.NewJobs(pool, &coordinator.JobsConfig{Registerer: rec})
	require.NoError(t, err)
	_, err = newGauges(consumergroup.NewAdmin(pool), nil, rec)
	require.NoError(t, err)
	hub := wakeup.NewHub()
	_, err = wakeup.NewBroadcaster(&wakeup.BroadcasterConfig{ConnString: testdb.URL(t), Hub: hub, Registerer: rec})
	require.NoError(t, err)
	_, err = wakeup.NewListener(&wakeup.ListenerConfig{ConnString: testdb.URL(t), Registerer: rec})
	require.NoError(t, err)

	raw, err := os.ReadFile("../../docs/grafana/streamd.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	metricRef := regexp.MustCompile(`streamd_[a-z_]+`)
	used := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, name := range metricRef.FindAllString(tg.Expr, -1) {
				base := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if !rec.names[base] && strings.HasSuffix(base, suffix) {
						base = strings.TrimSuffix(base, suffix)
					}
				}
				require.True(t, rec.names[base], "panel %q uses %s, which nothing registers", p.Title, name)
				used++
			}
		}
	}
	require.Greater(t, used, 20)
}
