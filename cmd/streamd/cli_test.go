package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/localpg"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// run executes the CLI in-process with args against the test database.
func run(t *testing.T, ctx context.Context, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(append([]string{"--database-url", testdb.URL(t)}, args...))
	err := cmd.ExecuteContext(ctx)
	if err != nil {
		return out.String() + errOut.String(), err
	}
	return out.String(), nil
}

// freeAddr returns a loopback address with a port free a moment ago, below the
// ephemeral range (localpg.FreePort): the server binds it only once started.
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := localpg.FreePort()
	require.NoError(t, err)
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// serveInProcess runs streamd serve in-process on a free loopback address, with args
// after its --http-addr (and --retention-streams limited to a stream no test has),
// until cancel is called; done then yields serve's error.
func serveInProcess(t *testing.T, args ...string) (addr string, cancel func(), done <-chan error) {
	t.Helper()
	addr = freeAddr(t)
	ctx, cancelCtx := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { // owner: the test; ends when it calls cancel
		_, err := run(t, ctx, "", append([]string{"serve", "--http-addr", addr, "--retention-streams", "none-in-this-test"}, args...)...)
		errc <- err
	}()
	return addr, cancelCtx, errc
}

func TestCLIStreamProduceFetch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testdb.Name("cli")
	_, err := run(t, ctx, "", "stream", "create", s, "--partitions", "2")
	require.NoError(t, err)
	out, err := run(t, ctx, "{\"n\":1}\nplain text\n{\"n\":3}\n", "produce", s, "--partition", "1", "--type", "T", "-H", "a=b", "--string")
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%s/1@0\n%s/1@1\n%s/1@2\n", s, s, s), out)

	out, err = run(t, ctx, "", "fetch", s, "--partition", "1", "--offset", "1")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	var ev streams.Event
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &ev))
	require.Equal(t, int64(1), ev.Offset)
	require.JSONEq(t, `"plain text"`, string(ev.Data))
	require.Equal(t, "T", ev.EventType)
	require.Equal(t, map[string]string{"a": "b"}, ev.Headers)

	out, err = run(t, ctx, "", "stream", "describe", s, "-O", "json")
	require.NoError(t, err)
	var info struct {
		PartitionInfo []struct {
			Partition  int32 `json:"partition"`
			NextOffset int64 `json:"next_offset"`
		} `json:"partition_info"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &info))
	require.Len(t, info.PartitionInfo, 2)
	require.Equal(t, int64(3), info.PartitionInfo[1].NextOffset)

	out, err = run(t, ctx, "", "stream", "list")
	require.NoError(t, err)
	require.Contains(t, out, s)

	// Bad input: an error that says what was wrong, nothing written.
	out, err = run(t, ctx, "{}\n", "produce", s, "--partition", "7")
	require.Error(t, err)
	require.Contains(t, out, "partition")
	_, err = run(t, ctx, "", "stream", "create", "bad name")
	require.ErrorContains(t, err, "invalid")
	_, err = run(t, ctx, "", "stream", "list", "-O", "yaml")
	require.ErrorContains(t, err, "--output")

	_, err = run(t, ctx, "", "stream", "delete", s)
	require.NoError(t, err)
	_, err = run(t, ctx, "", "stream", "describe", s)
	require.ErrorContains(t, err, "not found")
}

// TestServeHealthMetricsAndCleanStop: serve answers /healthz and a /metrics page that
// the Prometheus text parser accepts, and returns nil when its context ends (what
// SIGINT and SIGTERM do through signal.NotifyContext in main).
func TestServeHealthMetricsAndCleanStop(t *testing.T) {
	t.Parallel()
	addr, cancel, done := serveInProcess(t, "--auth-token", "test-token-0123456789",
		"--coordinator-name", testdb.Name("serve-test"), "--metrics-interval", "100ms")
	var resp *http.Response
	var err error
	require.Eventually(t, func() bool {
		resp, err = http.Get("http://" + addr + "/healthz")
		return err == nil
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()

	// The only instance becomes leader and refreshes the fleet gauges.
	var families map[string]*dto.MetricFamily
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err = parser.TextToMetricFamilies(bufio.NewReader(resp.Body))
		require.NoError(t, err)
		leader, updated := families["streamd_coordinator_is_leader"], families["streamd_coordinator_gauges_updated_timestamp_seconds"]
		return leader != nil && leader.Metric[0].GetGauge().GetValue() == 1 &&
			updated != nil && updated.Metric[0].GetGauge().GetValue() > 0
	}, 30*time.Second, 50*time.Millisecond)
	require.Contains(t, families, "streamd_up")
	require.Contains(t, families, "streamd_tailer_connected", "the leader runs the wake-up tailer")
	// The lease is renewed on a pool of its own, not the API's (a burst of requests
	// that took every API connection made renewals time out and leadership flap).
	var electorConns int
	require.NoError(t, testdb.Pool(t).QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", electorApplicationName).Scan(&electorConns))
	require.Positive(t, electorConns, "no connection of the elector's own pool")
	for name := range families {
		if !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") && !strings.HasPrefix(name, "promhttp_") {
			require.True(t, strings.HasPrefix(name, "streamd_"), "metric %s", name)
		}
	}

	resp, err = http.Get("http://" + addr + "/readyz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "ready leader\n", string(body))

	resp, err = http.Get("http://" + addr + "/v1/streams")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop after its context ended")
	}
	_, err = http.Get("http://" + addr + "/healthz")
	require.Error(t, err, "the listener is closed")
}

// TestMigrateFreshDatabase: streamd migrate sets up a database that has no streamd
// schema (it used to refuse, saying to run streamd migrate first), and commands that
// need the schema then work; before the migration they say what to run.
func TestMigrateFreshDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.FreshDatabase(t)
	runOn := func(args ...string) (string, error) {
		cmd := newRootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"--database-url", url}, args...))
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}
	_, err := runOn("stream", "list")
	require.ErrorContains(t, err, "run 'streamd migrate' first")
	out, err := runOn("migrate")
	require.NoError(t, err, out)
	_, err = runOn("stream", "create", "fresh-db-stream")
	require.NoError(t, err)
	out, err = runOn("stream", "list")
	require.NoError(t, err)
	require.Contains(t, out, "fresh-db-stream")
	out, err = runOn("migrate") // twice is safe
	require.NoError(t, err, out)
}

// TestCLIZeroFlagsRefused: a flag whose 0 the library reads as "the default" is
// refused when given as 0, before anything runs.
func TestCLIZeroFlagsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, args := range [][]string{
		{"consume", "--stream", "s", "--group", "g", "--batch-size", "0"},
		{"consume", "--stream", "s", "--group", "g", "--session-timeout", "0s"},
		{"forward", "--stream", "s", "--batch-size", "-1"},
		{"forward", "--stream", "s", "--confirm-timeout", "0s"},
		{"retention", "apply", "--batch-size", "0"},
	} {
		_, err := run(t, ctx, "", args...)
		require.ErrorContains(t, err, ": must be more than 0", "%v", args)
	}
}

// TestServeStopsWithALongPollRunning: serve's shutdown does not wait out
// --shutdown-timeout for a long poll (a receive waiting 30 s): past half of it the
// remaining requests are cancelled and serve stops cleanly (it used to return the
// shutdown's deadline error); the long poll and a fetch long poll answer 503 with
// Retry-After (they used to answer 499, "the client closed the request").
func TestServeStopsWithALongPollRunning(t *testing.T) {
	t.Parallel()
	addr, cancel, done := serveInProcess(t, "--auth-disabled", "--shutdown-timeout", "4s",
		"--coordinator-name", testdb.Name("serve-lp"))
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}, 30*time.Second, 20*time.Millisecond)
	q := testdb.Name("lp")
	resp, err := http.Post("http://"+addr+"/v1/queues", "application/json", strings.NewReader(fmt.Sprintf(`{"name":%q}`, q)))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	s := testdb.Name("lp")
	resp, err = http.Post("http://"+addr+"/v1/streams", "application/json", strings.NewReader(fmt.Sprintf(`{"name":%q}`, s)))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	// Each poll goes on a connection of its own and signals once its request is
	// written. A fresh connection the server accepted is one that Shutdown waits for
	// (an idle keep-alive one it closes); the accept queue is first in, first out, so
	// once a later fresh connection (healthz below) is answered, both polls' were
	// accepted.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	answers, sent := make(chan string, 2), make(chan struct{}, 2)
	poll := func(method, url, body string) {
		trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { sent <- struct{}{} }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), method, url, strings.NewReader(body))
		if err != nil {
			answers <- err.Error()
			sent <- struct{}{}
			return
		}
		resp, err := fresh.Do(req)
		if err != nil {
			answers <- err.Error()
			return
		}
		resp.Body.Close()
		answers <- fmt.Sprintf("%d retry-after=%s", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	go poll("POST", "http://"+addr+"/v1/queues/"+q+"/receive", `{"wait_ms":30000}`)
	go poll("GET", "http://"+addr+"/v1/streams/"+s+"/partitions/0/records?offset=0&wait_ms=30000", "")
	for range 2 {
		select {
		case <-sent:
		case <-time.After(20 * time.Second):
			t.Fatal("the long polls were not sent")
		}
	}
	resp, err = fresh.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "a clean stop")
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop")
	}
	for range 2 {
		require.Equal(t, "503 retry-after=1", <-answers)
	}
}

// TestCLIProduceLineTooLong: a line over 16 MiB fails alone, named by its number; the
// lines around it are produced and reported. produce used to stop reading there and
// return without reporting the records already sent.
func TestCLIProduceLineTooLong(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testdb.Name("longline")
	_, err := run(t, ctx, "", "stream", "create", s)
	require.NoError(t, err)
	input := "1\n" + strings.Repeat("x", 17<<20) + "\n3\n"
	out, err := run(t, ctx, input, "produce", s)
	require.ErrorContains(t, err, "1 of 3 records failed")
	require.Contains(t, out, "line 2: line longer than")
	require.Contains(t, out, s+"/0@0")
	require.Contains(t, out, s+"/0@1", "the line after it was produced")
}
