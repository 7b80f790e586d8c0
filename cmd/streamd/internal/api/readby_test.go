package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

// GET /v1/streams/{stream}/events reads by correlation id or event type, pages with
// after_partition/after_offset, and refuses bad input; PUT and DELETE
// .../read-indexes/{kind} enable and drop the stream's read index (admin only).
func TestReadByAPI(t *testing.T) {
	t.Parallel()
	c, sc := newServer(t)
	s := testdb.Name("api")
	require.NoError(t, sc.CreateStream(context.Background(), s, 2))
	var recs []streams.Record
	for i := 0; i < 10; i++ {
		recs = append(recs, streams.Record{Stream: s, Key: fmt.Sprint(i), EventType: "T", CorrelationID: fmt.Sprint("c", i%2),
			Data: json.RawMessage(`{}`)})
	}
	_, err := sc.Produce(context.Background(), recs...)
	require.NoError(t, err)

	code, body := c.do("GET", "/v1/streams/"+s+"/events?correlation_id=c1", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Len(t, body["events"], 5)
	code, body = c.do("GET", "/v1/streams/"+s+"/events?event_type=T&limit=4", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	page := body["events"].([]any)
	require.Len(t, page, 4)
	last := page[3].(map[string]any)
	code, body = c.do("GET", fmt.Sprintf("/v1/streams/%s/events?event_type=T&after_partition=%v&after_offset=%v",
		s, last["partition"], last["offset"]), adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Len(t, body["events"], 6)

	code, body = c.do("PUT", "/v1/streams/"+s+"/read-indexes/correlation_id", aliceToken, "")
	require.Equal(t, http.StatusForbidden, code, "%v", body)
	code, body = c.do("PUT", "/v1/streams/"+s+"/read-indexes/correlation_id", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Len(t, body["read_indexes"], 1)
	code, body = c.do("GET", "/v1/streams/"+s+"/events?correlation_id=c1", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Len(t, body["events"], 5)
	code, body = c.do("DELETE", "/v1/streams/"+s+"/read-indexes/correlation_id", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Empty(t, body["read_indexes"])

	for _, tc := range []struct {
		name, method, path string
		want               int
	}{
		{"neither", "GET", "/v1/streams/" + s + "/events", 400},
		{"both", "GET", "/v1/streams/" + s + "/events?correlation_id=a&event_type=b", 400},
		{"limit", "GET", "/v1/streams/" + s + "/events?event_type=T&limit=0", 400},
		{"unknown stream", "GET", "/v1/streams/" + testdb.Name("missing") + "/events?event_type=T", 404},
		{"unknown kind", "PUT", "/v1/streams/" + s + "/read-indexes/key", 400},
	} {
		code, body := c.do(tc.method, tc.path, adminToken, "")
		require.Equal(t, tc.want, code, "%s: %v", tc.name, body)
	}
}
