package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// TestPrometheusScrapes runs a real Prometheus (Debian's prometheus package) that
// scrapes streamd serve's /metrics on loopback, and checks through Prometheus's query
// API that the scrape succeeded and streamd's series arrived. It runs only when
// STREAMD_PROMETHEUS_TEST=1 (make test-prometheus, which installs the package).
func TestPrometheusScrapes(t *testing.T) {
	if os.Getenv("STREAMD_PROMETHEUS_TEST") != "1" {
		t.Skip("set STREAMD_PROMETHEUS_TEST=1 (make test-prometheus) to run against a real Prometheus")
	}
	bin, err := exec.LookPath("prometheus")
	require.NoError(t, err, "the prometheus binary is needed: apt-get install prometheus (make test-prometheus does)")

	promAddr := freeAddr(t)
	streamdAddr, cancel, done := serveInProcess(t, "--auth-token", "prom-test-token-0123456789",
		"--coordinator-name", testdb.Name("prom-test"), "--metrics-interval", "200ms")
	defer func() { cancel(); <-done }()

	dir := t.TempDir()
	conf := fmt.Sprintf(`global:
  scrape_interval: 1s
scrape_configs:
  - job_name: streamd
    static_configs:
      - targets: ['%s']
`, streamdAddr)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(conf), 0o644))
	var logs syncBuffer
	prom := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+promAddr)
	prom.Stdout, prom.Stderr = &logs, &logs
	require.NoError(t, prom.Start())
	defer func() {
		_ = prom.Process.Kill()
		_, _ = prom.Process.Wait()
		if t.Failed() {
			t.Logf("prometheus output:\n%s", logs.String())
		}
	}()

	query := func(q string) []any {
		resp, err := http.Get("http://" + promAddr + "/api/v1/query?query=" + q)
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var out struct {
			Data struct {
				Result []any `json:"result"`
			} `json:"data"`
		}
		if json.NewDecoder(resp.Body).Decode(&out) != nil {
			return nil
		}
		return out.Data.Result
	}
	require.Eventually(t, func() bool {
		r := query(`up{job="streamd"}==1`)
		return len(r) == 1
	}, 60*time.Second, 250*time.Millisecond, "Prometheus never scraped streamd successfully")
	require.Eventually(t, func() bool {
		return len(query(`streamd_coordinator_is_leader==1`)) == 1 && len(query(`streamd_up`)) == 1
	}, 30*time.Second, 250*time.Millisecond)
	// The scrape itself reported no parse problems.
	require.Empty(t, query(`scrape_samples_post_metric_relabeling{job="streamd"}==0`))
}
