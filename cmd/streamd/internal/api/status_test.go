package api_test

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// TestStatusesOfBadRequests: each defect of issue 18's list gets its status and a
// message in the API's own words: a negative partition is 400 like a negative offset
// (it was 404); unknown status filters are 400 (they answered 200 with an empty
// list); a negative offset to discard is 400 (200); a wrong method on a known route
// is 405 with Allow (404); peek's bad limit names the query parameter, not a Go field;
// a peeked message has no receipt (it had a zeroed one); a configuration over the
// request size limit is 413 like every other body (it was 500); a negative produce
// partition, dead-letter or redrive task id is 400 as docs/api.md says (they were
// 404), and a negative read-by cursor 400 (it was taken); fetch's max=0 is 400 like
// peek's limit=0 and receive's max 0 (it fetched up to the library's default, 500);
// a boolean query parameter that is not one is 400 (replace=yes merged, force=yes
// did not force); a send's bad delay_ms names its message as the library counts them,
// from 1 (it named the one before); an event id, event type or correlation id longer
// than 1024 bytes is 400 (they are indexed: an event id over an index row's size was
// a 500, SQLSTATE 54000, and an event type or correlation id stored that long made
// its read index impossible to build, a 500 too); receive's max over 10000 names max,
// not ReceiveOpts.Max.
func TestStatusesOfBadRequests(t *testing.T) {
	t.Parallel()
	c, sc := newServer(t)
	s, q := c.streamAndQueue(sc, "st")
	code, body := c.do("POST", "/v1/queues/"+q+"/messages", adminToken, `{"messages":[{"data":{"n":1}}]}`)
	require.Equal(t, http.StatusOK, code, "%v", body)

	for _, tc := range []struct {
		name, method, path, body string
		want                     int
		says                     string
	}{
		{"negative partition", "GET", "/v1/streams/" + s + "/partitions/-1/records", "", 400, "partition -1"},
		{"negative offset", "GET", "/v1/streams/" + s + "/partitions/0/records?offset=-1", "", 400, "offset"},
		{"missing partition", "GET", "/v1/streams/" + s + "/partitions/7/records", "", 404, ""},
		{"bogus redrive status", "GET", "/v1/redrive-tasks?status=bogus", "", 400, "status"},
		{"bogus dead-letter status", "GET", "/v1/streams/" + s + "/dead-letters?status=bogus", "", 400, "status"},
		{"negative discard", "POST", "/v1/queues/" + q + "/discard", `{"offsets":[-1]}`, 400, "offsets[0]"},
		{"peek limit", "GET", "/v1/queues/" + q + "/messages?limit=-1", "", 400, "limit"},
		// JSON that Go takes and jsonb refuses is bad input, not an internal error (it was
		// a 500: numeric's 22003 came back untyped).
		{"number jsonb cannot hold", "POST", "/v1/queues/" + q + "/messages", `{"messages":[{"data":[1e131072]}]}`, 400, "numeric"},
		{"wrong method", "GET", "/v1/queues/" + q + "/purge", "", 405, "POST"},
		{"no route", "GET", "/v1/nowhere", "", 404, ""},
		{"negative produce partition", "POST", "/v1/streams/" + s + "/records", `{"records":[{"data":{}},{"data":{},"partition":-1}]}`, 400, "records[1]: partition -1"},
		{"negative dead-letter id", "POST", "/v1/streams/" + s + "/dead-letters/-1/replay", "", 400, "id -1"},
		{"negative dead-letter id to discard", "POST", "/v1/streams/" + s + "/dead-letters/-1/discard", "", 400, "id -1"},
		{"negative redrive task id", "DELETE", "/v1/queues/" + q + "/redrive-tasks/-1", "", 400, "id -1"},
		{"negative read-by partition", "GET", "/v1/streams/" + s + "/events?event_type=t&after_partition=-1&after_offset=0", "", 400, "after_partition -1"},
		{"fetch max 0 (read as the default, 500)", "GET", "/v1/streams/" + s + "/partitions/0/records?max=0", "", 400, "max"},
		{"replace=yes (read as a merge)", "PUT", "/v1/streams/" + s + "/config?replace=yes", `{}`, 400, "replace"},
		{"force=yes (read as false)", "DELETE", "/v1/streams/" + s + "/groups/g?force=yes", "", 400, "force"},
		{"second message's delay named as the first's", "POST", "/v1/queues/" + q + "/messages", `{"messages":[{"data":{}},{"data":{},"delay_ms":-1}]}`, 400, "message 2: delay_ms -1"},
		{"event id over an index row", "POST", "/v1/streams/" + s + "/records", `{"records":[{"data":{}},{"data":{},"event_id":"` + noise(3500) + `"}]}`, 400, "event id is longer than 1024 bytes"},
		{"event type over an index row", "POST", "/v1/streams/" + s + "/records", `{"records":[{"data":{},"event_type":"` + noise(1025) + `"}]}`, 400, "event type is longer than 1024 bytes"},
		{"receive max over 10000", "POST", "/v1/queues/" + q + "/receive", `{"max":10001}`, 400, "max 10001"},
		{"negative read-by offset", "GET", "/v1/streams/" + s + "/events?event_type=t&after_partition=0&after_offset=-1", "", 400, "after_offset -1"},
		{"config over the size limit", "PUT", "/v1/streams/" + s + "/config", `{"tags":{"a":"` + strings.Repeat("x", 5000) + `"}}`, 413, "over 4096 bytes"},
	} {
		code, body := c.do(tc.method, tc.path, adminToken, tc.body)
		require.Equal(t, tc.want, code, "%s: %v", tc.name, body)
		if tc.says != "" {
			require.Contains(t, body["error"], tc.says, tc.name)
		}
		require.NotContains(t, fmt.Sprint(body["error"]), "Opts.", "%s: the API's words, not Go's", tc.name)
	}
	require.Zero(t, count(t, sc, s), "a refused produce appends nothing")

	code, body = c.do("GET", "/v1/queues/"+q+"/messages", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	raw, _ := json.Marshal(body)
	require.NotContains(t, string(raw), "receipt", "a peeked message has no receipt")
	require.Contains(t, string(raw), `"offset"`)

	code, body = c.do("POST", "/v1/queues/"+q+"/receive", adminToken, `{}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	raw, _ = json.Marshal(body)
	require.Contains(t, string(raw), `"receipt_handle":"`+q+`/`)
	require.True(t, strings.Contains(string(raw), `"lease_token":"`), "a token in hex: %s", raw)
}

// TestAlterStream: POST of an existing stream is 409 and changes nothing; PATCH grows
// it and sets its payload limit; bad values are 400; a refused PATCH changes nothing
// (its payload limit was written before the grow failed).
func TestAlterStream(t *testing.T) {
	t.Parallel()
	c, _ := newServer(t)
	s := testdb.Name("alter")
	code, body := c.do("POST", "/v1/streams", adminToken, fmt.Sprintf(`{"name":%q,"partitions":2}`, s))
	require.Equal(t, http.StatusCreated, code, "%v", body)
	code, body = c.do("POST", "/v1/streams", adminToken, fmt.Sprintf(`{"name":%q,"partitions":3}`, s))
	require.Equal(t, http.StatusConflict, code, "%v", body)
	code, body = c.do("PATCH", "/v1/streams/"+s, adminToken, `{"partitions":3,"max_payload_bytes":1000}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.EqualValues(t, 3, body["partitions"])
	require.EqualValues(t, 1000, body["max_payload_bytes"])
	for _, bad := range []string{`{}`, `{"partitions":0}`, `{"max_payload_bytes":0}`, `{"partitions":1}`} {
		code, body = c.do("PATCH", "/v1/streams/"+s, adminToken, bad)
		require.Contains(t, []int{400, 409}, code, "%s: %v", bad, body)
	}
	// A PATCH that fails writes nothing: its payload limit was set before the grow
	// was refused (fewer partitions, 409; over the library's 10000, 400).
	for _, bad := range []string{`{"partitions":2,"max_payload_bytes":2000}`, `{"partitions":20000,"max_payload_bytes":2000}`} {
		code, body = c.do("PATCH", "/v1/streams/"+s, adminToken, bad)
		require.Contains(t, []int{400, 409}, code, "%s: %v", bad, body)
		code, body = c.do("GET", "/v1/streams/"+s, adminToken, "")
		require.Equal(t, http.StatusOK, code, "%v", body)
		require.EqualValues(t, 1000, body["max_payload_bytes"], "%s wrote nothing", bad)
		require.EqualValues(t, 3, body["partitions"], "%s wrote nothing", bad)
	}
}

// noise is n bytes of incompressible text (an index row stores it at its length).
func noise(n int) string {
	r := rand.New(rand.NewSource(int64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[r.Intn(62)]
	}
	return string(b)
}
