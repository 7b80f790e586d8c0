package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
	"github.com/streamd/streamd/streams"
)

// TestDeadLetterEndpoints: both kinds of dead letters list by status and settle by id
// through the API, recording the principal: a group's are replayed (204: to the group
// only), discarded or resolved; a dead-letter queue's are replayed, discarded or
// resolved by message id. Bad input is 400 and writes nothing.
func TestDeadLetterEndpoints(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, sc := newServer(t)

	// Group dead letters: a consumer gives up on all three events.
	s := testdb.Name("api-dl")
	require.NoError(t, sc.CreateStream(ctx, s, 1))
	for i := 0; i < 3; i++ {
		_, err := sc.Produce(ctx, streams.Record{Stream: s, Data: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	cons, err := consumergroup.New(sc.Pool(), &consumergroup.Config{Stream: s, Group: "g", SessionTimeout: 5 * time.Second,
		OnHandlerError: consumergroup.ErrorDeadLetter, MaxRetries: consumergroup.NoRetries, FetchMaxWait: 50 * time.Millisecond})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- cons.Run(rctx, func(context.Context, *consumergroup.Batch) error { return errors.New("no") })
	}()
	var ids []float64
	testdb.WaitFor(t, 30*time.Second, "three dead letters", func() bool {
		code, body := c.do("GET", "/v1/streams/"+s+"/dead-letters?status=pending", adminToken, "")
		require.Equal(t, http.StatusOK, code, "%v", body)
		ids = nil
		for _, d := range body["dead_letters"].([]any) {
			ids = append(ids, d.(map[string]any)["id"].(float64))
		}
		return len(ids) == 3
	})
	stop()
	require.NoError(t, <-done)
	for i, action := range []string{"replay", "discard", "resolve"} {
		code, body := c.do("POST", fmt.Sprintf("/v1/streams/%s/dead-letters/%d/%s", s, int64(ids[i]), action), adminToken, "")
		require.Equal(t, http.StatusNoContent, code, "%s: %v", action, body)
		code, body = c.do("POST", fmt.Sprintf("/v1/streams/%s/dead-letters/%d/%s", s, int64(ids[i]), action), adminToken, "")
		require.Equal(t, http.StatusNotFound, code, "%s twice: %v", action, body)
	}
	for _, status := range []string{"replayed", "discarded", "resolved"} {
		code, body := c.do("GET", "/v1/streams/"+s+"/dead-letters?status="+status, adminToken, "")
		require.Equal(t, http.StatusOK, code, "%v", body)
		require.Len(t, body["dead_letters"], 1, status)
		require.Equal(t, "admin", body["dead_letters"].([]any)[0].(map[string]any)["resolved_by"], status)
	}
	var next int64
	require.NoError(t, sc.Pool().QueryRow(ctx, "SELECT next_offset FROM streamd.stream_partitions WHERE stream_name = $1", s).Scan(&next))
	require.Equal(t, int64(3), next, "a replay appends nothing")

	// Queue dead letters.
	qc, err := messages.NewClient(sc.Pool(), nil)
	require.NoError(t, err)
	q, dlq := testdb.Name("api-q"), testdb.Name("api-dlq")
	require.NoError(t, qc.CreateQueue(ctx, dlq, nil))
	require.NoError(t, qc.CreateQueue(ctx, q, &messages.QueueConfig{MaxDeliveryAttempts: 1, DeadLetterQueue: dlq}))
	for _, id := range []string{"a", "b", "c"} {
		_, err := qc.Send(ctx, q, messages.OutgoingMessage{MessageID: id, Data: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	got, err := qc.Receive(ctx, q, &messages.ReceiveOpts{Max: 3})
	require.NoError(t, err)
	for _, m := range got {
		require.NoError(t, qc.Nack(ctx, &messages.NackOpts{Error: "bad"}, m.Receipt))
	}
	code, body := c.do("GET", "/v1/queues/"+dlq+"/dead-letters?status=pending", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Len(t, body["dead_letters"], 3)
	for status, id := range map[string]string{"replay": "a", "discard": "b", "resolve": "c"} {
		code, body = c.do("POST", "/v1/queues/"+dlq+"/dead-letters/"+status, adminToken, `{"ids":["`+id+`"]}`)
		require.Equal(t, http.StatusOK, code, "%s: %v", status, body)
	}
	for status, id := range map[string]string{"replayed": "a", "discarded": "b", "resolved": "c"} {
		code, body = c.do("GET", "/v1/queues/"+dlq+"/dead-letters?status="+status, adminToken, "")
		require.Equal(t, http.StatusOK, code, "%v", body)
		require.Len(t, body["dead_letters"], 1, status)
		d := body["dead_letters"].([]any)[0].(map[string]any)
		require.Equal(t, id, d["message_id"])
		require.Equal(t, "admin", d["resolved_by"])
	}

	for _, tc := range []struct {
		name, method, path, body string
		want                     int
	}{
		{"group: bogus status", "GET", "/v1/streams/" + s + "/dead-letters?status=bogus", "", 400},
		{"group: resolve unknown", "POST", "/v1/streams/" + s + "/dead-letters/999999/resolve", "", 404},
		{"queue: bogus status", "GET", "/v1/queues/" + dlq + "/dead-letters?status=bogus", "", 400},
		{"queue: no ids", "POST", "/v1/queues/" + dlq + "/dead-letters/resolve", `{"ids":[]}`, 400},
		{"queue: unknown queue", "GET", "/v1/queues/" + testdb.Name("nope") + "/dead-letters", "", 404},
		{"queue: not admin", "GET", "/v1/queues/" + dlq + "/dead-letters", "", 401},
	} {
		token := adminToken
		if tc.want == 401 {
			token = ""
		}
		code, body := c.do(tc.method, tc.path, token, tc.body)
		require.Equal(t, tc.want, code, "%s: %v", tc.name, body)
	}
}
