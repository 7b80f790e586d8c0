package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTextPostgreSQLCannotStoreIs400: a NUL byte in a name, id or text that reaches
// SQL as a bind parameter (PostgreSQL refuses it: 22021, or 22P05 inside jsonb) is
// the client's mistake, 400 saying so; it was 500 "internal" on every route whose
// library does not check the text first (14 here).
func TestTextPostgreSQLCannotStoreIs400(t *testing.T) {
	t.Parallel()
	c, sc := newServer(t)
	s, q := c.streamAndQueue(sc, "nul")
	code, body := c.do("PUT", "/v1/streams/"+s+"/config", adminToken, `{"tags":{"team":"a"}}`)
	require.Equal(t, http.StatusOK, code, "%v", body)

	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/v1/streams/a%00b", ""},
		{"GET", "/v1/streams/a%00b/groups", ""},
		{"DELETE", "/v1/queues/a%00b/redrive-tasks/1", ""},
		{"GET", "/v1/streams/" + s + "/groups/a%00b", ""},
		{"GET", "/v1/streams/" + s + "/groups/a%00b/offsets", ""},
		{"PUT", "/v1/streams/" + s + "/groups/a%00b/offsets", `{"offsets":[{"partition":0,"offset":0}],"execute":true}`},
		{"POST", "/v1/streams/" + s + "/groups/a%00b/reset-offsets", `{"mode":"earliest","execute":true}`},
		{"DELETE", "/v1/streams/" + s + "/groups/a%00b", ""},
		{"GET", "/v1/streams/" + s + "/dead-letters?group=a%00b", ""},
		{"GET", "/v1/streams/" + s + "/events?event_type=a%00b", ""},
		{"GET", "/v1/streams/" + s + "/events?correlation_id=a%00b", ""},
		{"POST", "/v1/queues/" + q + "/dead-letters/replay", `{"ids":["a\u0000"]}`},
		{"POST", "/v1/queues/" + q + "/nack", `{"receipts":[{}],"error":"a\u0000"}`},
		{"PUT", "/v1/streams/" + s + "/config", `{"tags":{"team":"\u0000"}}`},
	} {
		code, body := c.do(tc.method, tc.path, adminToken, tc.body)
		assert.Equal(t, http.StatusBadRequest, code, "%s %s %s: %v", tc.method, tc.path, tc.body, body)
		assert.Equal(t, "bad_request", body["code"], "%s %s", tc.method, tc.path)
	}
	code, body = c.do("GET", "/v1/streams/"+s+"/config", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, map[string]any{"team": "a"}, body["tags"], "the refused configuration wrote nothing")
	code, body = c.do("GET", "/v1/streams/"+s+"/groups", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Empty(t, body["groups"], "no group was made")
}
