package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streams"
)

func TestGroupsEndpoints(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, sc := newServer(t)
	s := testdb.Name("api-groups")
	require.NoError(t, sc.CreateStream(ctx, s, 2))
	for i := 0; i < 4; i++ {
		_, err := sc.Produce(ctx, streams.Record{Stream: s, Partition: streams.PartitionOf(int32(i % 2)), Data: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	// A member consumes everything, commits, and leaves.
	cons, err := consumergroup.New(sc.Pool(), &consumergroup.Config{Stream: s, Group: "g1", SessionTimeout: 5 * time.Second})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	seen := 0
	require.NoError(t, cons.Run(rctx, func(ctx context.Context, b *consumergroup.Batch) error {
		if seen += len(b.Events); seen == 4 {
			stop()
		}
		return nil
	}))

	code, body := c.do("GET", "/v1/streams/"+s+"/groups", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Len(t, body["groups"], 1)
	code, body = c.do("GET", "/v1/streams/"+s+"/groups/g1", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	raw, _ := json.Marshal(body)
	require.Contains(t, string(raw), `"lag":0`)

	// A reset is a preview unless it says execute (kafka-consumer-groups' --dry-run
	// and --execute): the preview changed nothing.
	code, body = c.do("POST", "/v1/streams/"+s+"/groups/g1/reset-offsets", adminToken, `{"mode":"offset","value":1}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, false, body["executed"])
	require.Len(t, body["changes"], 2)
	code, body = c.do("GET", "/v1/streams/"+s+"/groups/g1", adminToken, "")
	require.Equal(t, http.StatusOK, code)
	raw, _ = json.Marshal(body)
	require.Contains(t, string(raw), `"lag":0`, "a preview changes nothing")

	code, body = c.do("POST", "/v1/streams/"+s+"/groups/g1/reset-offsets", adminToken, `{"mode":"earliest","execute":true}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, true, body["executed"])
	require.Len(t, body["changes"], 2)
	code, body = c.do("GET", "/v1/streams/"+s+"/groups/g1", adminToken, "")
	require.Equal(t, http.StatusOK, code)
	raw, _ = json.Marshal(body)
	require.Contains(t, string(raw), `"lag":2`)

	// The committed offsets, exported and set back (the CLI's groups offsets export
	// and reset-offsets --from-file): a preview unless execute.
	code, body = c.do("GET", "/v1/streams/"+s+"/groups/g1/offsets", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	raw, _ = json.Marshal(body)
	require.JSONEq(t, `{"offsets":[{"partition":0,"offset":0},{"partition":1,"offset":0}]}`, string(raw))
	code, body = c.do("PUT", "/v1/streams/"+s+"/groups/g1/offsets", adminToken, `{"offsets":[{"partition":1,"offset":2}]}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	raw, _ = json.Marshal(body)
	require.JSONEq(t, `{"changes":[{"partition":1,"previous_offset":0,"new_offset":2}],"executed":false}`, string(raw))
	code, body = c.do("PUT", "/v1/streams/"+s+"/groups/g1/offsets", adminToken, `{"offsets":[{"partition":1,"offset":2}],"execute":true}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	code, body = c.do("GET", "/v1/streams/"+s+"/groups/g1/offsets", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	raw, _ = json.Marshal(body)
	require.JSONEq(t, `{"offsets":[{"partition":0,"offset":0},{"partition":1,"offset":2}]}`, string(raw))

	for _, tc := range []struct {
		name, method, path, body string
		want                     int
	}{
		{"no offsets", "PUT", "/v1/streams/" + s + "/groups/g1/offsets", `{"offsets":[],"execute":true}`, 400},
		{"offset without partition", "PUT", "/v1/streams/" + s + "/groups/g1/offsets", `{"offsets":[{"offset":1}],"execute":true}`, 400},
		{"no such partition", "PUT", "/v1/streams/" + s + "/groups/g1/offsets", `{"offsets":[{"partition":0,"offset":0},{"partition":9,"offset":0}],"execute":true}`, 400},
		{"partition twice", "PUT", "/v1/streams/" + s + "/groups/g1/offsets", `{"offsets":[{"partition":0,"offset":0},{"partition":0,"offset":1}],"execute":true}`, 400},
		{"export of an unknown group", "GET", "/v1/streams/" + s + "/groups/nope/offsets", "", 404},
		{"set offsets of an unknown group", "PUT", "/v1/streams/" + s + "/groups/nope/offsets", `{"offsets":[{"partition":0,"offset":0}],"execute":true}`, 404},
		{"unknown mode", "POST", "/v1/streams/" + s + "/groups/g1/reset-offsets", `{"mode":"sideways"}`, 400},
		{"timestamp without time", "POST", "/v1/streams/" + s + "/groups/g1/reset-offsets", `{"mode":"timestamp"}`, 400},
		{"offset without value", "POST", "/v1/streams/" + s + "/groups/g1/reset-offsets", `{"mode":"offset","execute":true}`, 400},
		{"shift without value", "POST", "/v1/streams/" + s + "/groups/g1/reset-offsets", `{"mode":"shift","execute":true}`, 400},
		{"value without offset or shift", "POST", "/v1/streams/" + s + "/groups/g1/reset-offsets", `{"mode":"latest","value":3}`, 400},
		// (It executed the latest reset, the time ignored.)
		{"time without timestamp", "POST", "/v1/streams/" + s + "/groups/g1/reset-offsets", `{"mode":"latest","time":"2026-01-01T00:00:00Z","execute":true}`, 400},
		{"unknown group", "POST", "/v1/streams/" + s + "/groups/nope/reset-offsets", `{"mode":"latest"}`, 404},
		{"unknown dead letter", "POST", "/v1/streams/" + s + "/dead-letters/999999/replay", "", 404},
	} {
		code, body := c.do(tc.method, tc.path, adminToken, tc.body)
		require.Equal(t, tc.want, code, "%s: %v", tc.name, body)
	}
	code, _ = c.do("DELETE", "/v1/streams/"+s+"/groups/g1", bobToken, "")
	require.Equal(t, http.StatusForbidden, code)
	code, _ = c.do("DELETE", "/v1/streams/"+s+"/groups/g1", adminToken, "")
	require.Equal(t, http.StatusNoContent, code)
	code, _ = c.do("GET", "/v1/streams/"+s+"/groups/g1", adminToken, "")
	require.Equal(t, http.StatusNotFound, code)
}

func TestQueueEndpoints(t *testing.T) {
	t.Parallel()
	c, sc := newServer(t)
	q := testdb.Name("api-q")
	code, body := c.do("POST", "/v1/queues", adminToken, fmt.Sprintf(`{"name":%q,"visibility_timeout_ms":60000}`, q))
	require.Equal(t, http.StatusCreated, code, "%v", body)
	code, _ = c.do("POST", "/v1/queues", aliceToken, fmt.Sprintf(`{"name":%q}`, q+"x"))
	require.Equal(t, http.StatusForbidden, code)
	// Posting an existing queue changes only the settings given.
	code, body = c.do("POST", "/v1/queues", adminToken, fmt.Sprintf(`{"name":%q,"max_delivery_attempts":9}`, q))
	require.Equal(t, http.StatusCreated, code, "%v", body)
	require.EqualValues(t, 9, body["max_delivery_attempts"])
	require.EqualValues(t, 60000, body["visibility_timeout_ms"], "kept, not reset to the default; milliseconds as in the request")

	code, body = c.do("POST", "/v1/queues/"+q+"/messages", adminToken, `{"messages":[{"data":{"n":1}},{"data":{"n":2},"message_id":"m2"}]}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	code, body = c.do("POST", "/v1/queues/"+q+"/receive", adminToken, `{"max":10}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	msgs := body["messages"].([]any)
	require.Len(t, msgs, 2)
	receipts := []any{msgs[0].(map[string]any)["receipt"], msgs[1].(map[string]any)["receipt"]}
	ack, _ := json.Marshal(map[string]any{"receipts": receipts[:1]})
	code, body = c.do("POST", "/v1/queues/"+q+"/ack", adminToken, string(ack))
	require.Equal(t, http.StatusNoContent, code, "%v", body)
	code, body = c.do("POST", "/v1/queues/"+q+"/ack", adminToken, string(ack))
	require.Equal(t, http.StatusConflict, code, "a settled receipt cannot settle again: %v", body)
	require.Equal(t, "lease_lost", body["code"])

	// A nack with a backoff schedule: attempt 1 waits base_ms.
	nack, _ := json.Marshal(map[string]any{"receipts": receipts[1:], "backoff": map[string]any{"base_ms": 3600000, "max_ms": 7200000}})
	code, body = c.do("POST", "/v1/queues/"+q+"/nack", adminToken, string(nack))
	require.Equal(t, http.StatusNoContent, code, "%v", body)
	var wait float64
	require.NoError(t, sc.Pool().QueryRow(context.Background(),
		"SELECT extract(epoch FROM not_before - now()) FROM streamd.messages WHERE stream_name = $1", q).Scan(&wait))
	require.InDelta(t, 3600, wait, 60, "visible again in base_ms")

	// A release gives a message back at once, its attempt not spent.
	code, body = c.do("POST", "/v1/queues/"+q+"/messages", adminToken, `{"messages":[{"data":{"n":3},"message_id":"m3"}]}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	code, body = c.do("POST", "/v1/queues/"+q+"/receive", adminToken, `{"max":10}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	released := body["messages"].([]any)[0].(map[string]any)
	require.Equal(t, "m3", released["message_id"])
	// Nack's delay_ms, backoff and error do not go with a release or an ack: 400, and
	// the message stays leased (a release with delay_ms released it at once; an ack
	// with one deleted it).
	for _, verb := range []string{"release", "ack"} {
		for _, knob := range []map[string]any{{"delay_ms": 60000}, {"backoff": map[string]int{"base_ms": 1, "max_ms": 2}}, {"error": "why"}} {
			knob["receipts"] = []any{released["receipt"]}
			bad, _ := json.Marshal(knob)
			code, body = c.do("POST", "/v1/queues/"+q+"/"+verb, adminToken, string(bad))
			require.Equal(t, http.StatusBadRequest, code, "%s %s: %v", verb, bad, body)
		}
	}
	release, _ := json.Marshal(map[string]any{"receipts": []any{released["receipt"]}})
	code, body = c.do("POST", "/v1/queues/"+q+"/release", adminToken, string(release))
	require.Equal(t, http.StatusNoContent, code, "%v", body)
	code, body = c.do("POST", "/v1/queues/"+q+"/release", adminToken, string(release))
	require.Equal(t, http.StatusConflict, code, "a released receipt cannot settle again: %v", body)
	var attempts int
	require.NoError(t, sc.Pool().QueryRow(context.Background(),
		"SELECT delivery_attempts FROM streamd.messages WHERE stream_name = $1 AND message_id = 'm3'", q).Scan(&attempts))
	require.Zero(t, attempts, "the released delivery did not count")
	code, body = c.do("POST", "/v1/queues/"+q+"/discard", adminToken, `{"offsets":[`+fmt.Sprint(released["offset"])+`]}`)
	require.Equal(t, http.StatusOK, code, "%v", body)

	code, body = c.do("GET", "/v1/queues/"+q, adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)

	var n int
	count := func() int {
		require.NoError(t, sc.Pool().QueryRow(context.Background(), "SELECT count(*) FROM streamd.messages WHERE stream_name = $1", q).Scan(&n))
		return n
	}
	require.Equal(t, 1, count())
	for _, tc := range []struct {
		name, path, body string
		want             int
	}{
		{"invalid JSON data", "/v1/queues/" + q + "/messages", `{"messages":[{"data":{"n":`, 400},
		{"negative delay", "/v1/queues/" + q + "/messages", `{"messages":[{"data":{},"delay_ms":-5}]}`, 400},
		{"unknown queue", "/v1/queues/no-such-" + q + "/messages", `{"messages":[{"data":{}}]}`, 404},
		{"no messages", "/v1/queues/" + q + "/messages", `{"messages":[]}`, 400},
		{"receipt of another queue", "/v1/queues/" + q + "/ack", `{"receipts":[{"queue":"other","offset":1}]}`, 400},
		{"wait too long", "/v1/queues/" + q + "/receive", `{"wait_ms":999999}`, 400},
		{"backoff max under base", "/v1/queues/" + q + "/nack", `{"receipts":[{"offset":1}],"backoff":{"base_ms":100,"max_ms":10}}`, 400},
		{"receive max 0 (not read as 1)", "/v1/queues/" + q + "/receive", `{"max":0}`, 400},
		{"queue with max_delivery_attempts 0", "/v1/queues", fmt.Sprintf(`{"name":%q,"max_delivery_attempts":0}`, q+"z"), 400},
		{"queue with visibility_timeout_ms 0", "/v1/queues", fmt.Sprintf(`{"name":%q,"visibility_timeout_ms":0}`, q+"z"), 400},
		// 18446744073710 ms is 2^64 ns and 448384 ns: as a time.Duration it wrapped
		// around to half a millisecond (a message sent at once, a lease that ends).
		{"delay_ms past a Duration", "/v1/queues/" + q + "/messages", `{"messages":[{"data":{},"delay_ms":18446744073710}]}`, 400},
		{"visibility_timeout_ms past a Duration", "/v1/queues/" + q + "/receive", `{"visibility_timeout_ms":18446744073710}`, 400},
		{"nack delay_ms past a Duration", "/v1/queues/" + q + "/nack", `{"receipts":[{"offset":1}],"delay_ms":18446744073710}`, 400},
		{"queue visibility_timeout_ms past a Duration", "/v1/queues", fmt.Sprintf(`{"name":%q,"visibility_timeout_ms":18446744073710}`, q+"z"), 400},
	} {
		code, body := c.do("POST", tc.path, adminToken, tc.body)
		require.Equal(t, tc.want, code, "%s: %v", tc.name, body)
	}
	require.Equal(t, 1, count(), "bad requests wrote nothing")
	code, body = c.do("POST", "/v1/queues/"+q+"/purge", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, 0, count())
}
