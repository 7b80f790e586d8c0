package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/cmd/streamd/internal/api"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

const (
	adminToken = "admin-token-0123456789"
	aliceToken = "alice-token-0123456789"
	bobToken   = "bob-token-012345678901"
)

type client struct {
	t   *testing.T
	srv *httptest.Server
}

func newServer(t *testing.T) (*client, *streams.Client) {
	t.Helper()
	pool := testdb.Pool(t)
	s, err := api.New(pool, &api.Config{MaxRequestBytes: 4096, Tokens: map[string]string{
		adminToken: api.AdminPrincipal, aliceToken: "alice", bobToken: "bob"}})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &client{t: t, srv: srv}, streams.NewClient(pool, nil)
}

// streamAndQueue makes a stream of one partition and a queue, named from prefix, and
// returns their names.
func (c *client) streamAndQueue(sc *streams.Client, prefix string) (stream, queue string) {
	c.t.Helper()
	stream, queue = testdb.Name(prefix), testdb.Name(prefix+"-q")
	require.NoError(c.t, sc.CreateStream(context.Background(), stream, 1))
	code, body := c.do("POST", "/v1/queues", adminToken, fmt.Sprintf(`{"name":%q}`, queue))
	require.Equal(c.t, http.StatusCreated, code, "%v", body)
	return stream, queue
}

func (c *client) do(method, path, token, body string) (int, map[string]any) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.srv.URL+path, strings.NewReader(body))
	require.NoError(c.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	var out map[string]any
	if len(bytes.TrimSpace(raw)) > 0 {
		require.NoError(c.t, json.Unmarshal(raw, &out), "body %s", raw)
	}
	return resp.StatusCode, out
}

func count(t *testing.T, sc *streams.Client, stream string) int {
	t.Helper()
	var n int
	require.NoError(t, sc.Pool().QueryRow(context.Background(),
		"SELECT count(*) FROM streamd.events WHERE stream_name = $1", stream).Scan(&n))
	return n
}

func TestAuthAndAccessControl(t *testing.T) {
	t.Parallel()
	c, sc := newServer(t)
	s := testdb.Name("api")
	require.NoError(t, sc.CreateStream(context.Background(), s, 2))
	rec := `{"records":[{"key":"k","data":{"a":1}}]}`

	code, body := c.do("GET", "/v1/streams", "", "")
	require.Equal(t, http.StatusUnauthorized, code)
	require.Equal(t, "unauthorized", body["code"])
	code, _ = c.do("GET", "/v1/streams", "not-a-token-at-all-xx", "")
	require.Equal(t, http.StatusUnauthorized, code)

	// alice has no rights yet: 403, nothing written.
	code, body = c.do("POST", "/v1/streams/"+s+"/records", aliceToken, rec)
	require.Equal(t, http.StatusForbidden, code, "%v", body)
	require.Contains(t, body["error"], "alice")
	require.Zero(t, count(t, sc, s))
	code, _ = c.do("GET", "/v1/streams", aliceToken, "")
	require.Equal(t, http.StatusForbidden, code)

	// Grant alice produce, bob consume.
	_, err := sc.Pool().Exec(context.Background(), `INSERT INTO streamd.stream_configurations (stream_name, access_control_config)
		VALUES ($1, '{"writers":["alice"],"readers":["bob"]}')`, s)
	require.NoError(t, err)
	code, body = c.do("POST", "/v1/streams/"+s+"/records", aliceToken, rec)
	require.Equal(t, http.StatusOK, code, "%v", body)
	code, _ = c.do("POST", "/v1/streams/"+s+"/records", bobToken, rec)
	require.Equal(t, http.StatusForbidden, code)
	code, _ = c.do("GET", "/v1/streams/"+s+"/partitions/0/records", aliceToken, "")
	require.Equal(t, http.StatusForbidden, code)
	code, _ = c.do("GET", "/v1/streams/"+s+"/partitions/0/records", bobToken, "")
	require.Equal(t, http.StatusOK, code)
	code, _ = c.do("DELETE", "/v1/streams/"+s, bobToken, "")
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, 1, count(t, sc, s))
}

func TestProduceFetchAndBadInput(t *testing.T) {
	t.Parallel()
	c, sc := newServer(t)
	s := testdb.Name("api")
	code, body := c.do("POST", "/v1/streams", adminToken, fmt.Sprintf(`{"name":%q,"partitions":3}`, s))
	require.Equal(t, http.StatusCreated, code, "%v", body)
	require.Len(t, body["partition_info"], 3)

	code, body = c.do("POST", "/v1/streams/"+s+"/records", adminToken,
		`{"records":[{"partition":1,"event_type":"A","data":{"n":1},"headers":{"h":"v"}},{"partition":1,"data_bytes":"AAEC"}]}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Len(t, body["positions"], 2)

	code, body = c.do("GET", "/v1/streams/"+s+"/partitions/1/records?offset=0&max=10", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	events := body["events"].([]any)
	require.Len(t, events, 2)
	first := events[0].(map[string]any)
	require.Equal(t, map[string]any{"n": 1.0}, first["data"])
	require.Equal(t, "A", first["event_type"])
	require.Equal(t, "AAEC", events[1].(map[string]any)["data_bytes"])
	require.Equal(t, 2.0, body["next_offset"])

	for _, tc := range []struct {
		name, method, path, body string
		want                     int
	}{
		{"malformed JSON", "POST", "/v1/streams/" + s + "/records", `{"records":[{"data":`, 400},
		{"unknown field", "POST", "/v1/streams/" + s + "/records", `{"records":[{"dat":{}}]}`, 400},
		{"no records", "POST", "/v1/streams/" + s + "/records", `{"records":[]}`, 400},
		{"bad partition", "POST", "/v1/streams/" + s + "/records", `{"records":[{"partition":9,"data":{}}]}`, 404},
		{"one bad record fails the batch", "POST", "/v1/streams/" + s + "/records", `{"records":[{"data":{}},{"partition":-1,"data":{}}]}`, 400},
		{"unknown stream", "POST", "/v1/streams/no-such-" + s + "/records", `{"records":[{"data":{}}]}`, 404},
		{"invalid stream name", "POST", "/v1/streams", `{"name":"bad name","partitions":1}`, 400},
		{"decrease partitions", "POST", "/v1/streams", fmt.Sprintf(`{"name":%q,"partitions":1}`, s), 409},
		{"zero partitions (not read as 1)", "POST", "/v1/streams", fmt.Sprintf(`{"name":%q,"partitions":0}`, s+"-zero"), 400},
		{"partitions past int32", "POST", "/v1/streams", fmt.Sprintf(`{"name":%q,"partitions":4294967297}`, s+"-zero"), 400},
		{"body too large", "POST", "/v1/streams/" + s + "/records", `{"records":[{"data":"` + strings.Repeat("x", 5000) + `"}]}`, 413},
		{"offset not a number", "GET", "/v1/streams/" + s + "/partitions/0/records?offset=abc", "", 400},
		{"offset past the end", "GET", "/v1/streams/" + s + "/partitions/0/records?offset=99", "", 416},
		{"unknown route", "GET", "/v1/nothing", "", 404},
	} {
		code, body := c.do(tc.method, tc.path, adminToken, tc.body)
		require.Equal(t, tc.want, code, "%s: %v", tc.name, body)
		require.NotEmpty(t, body["error"], tc.name)
	}
	require.Equal(t, 2, count(t, sc, s), "bad requests wrote nothing")
	require.Zero(t, count(t, sc, "no-such-"+s))
	code, _ = c.do("GET", "/v1/streams/"+s+"-zero", adminToken, "")
	require.Equal(t, http.StatusNotFound, code, "no stream was created")
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	_, err := api.New(pool, &api.Config{})
	require.ErrorContains(t, err, "Tokens")
	_, err = api.New(pool, &api.Config{Tokens: map[string]string{"short": "x"}})
	require.ErrorContains(t, err, "shorter than 16")
	_, err = api.New(pool, &api.Config{AuthDisabled: true})
	require.NoError(t, err)
}
