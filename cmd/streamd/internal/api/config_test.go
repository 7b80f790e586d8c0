package api_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/testdb"
)

// PUT /v1/streams/{stream}/config replaces the sections given; an unknown section or
// key, or a wrong type, is 400 naming it and writes nothing; lifecycle_config.readOnly
// then refuses appends through the API.
func TestConfigAPI(t *testing.T) {
	t.Parallel()
	c, sc := newServer(t)
	s := testdb.Name("api")
	require.NoError(t, sc.CreateStream(context.Background(), s, 1))

	for _, bad := range []struct{ body, names string }{
		{`{"performance_config": {"foo": 1}}`, "performance_config"},
		{`{"performance_config": {"batchSize": "many"}}`, "performance_config"},
		{`{"performance_config": {"enableCompression": true, "compressionCodec": "brotli"}}`, "performance_config.compressionCodec"},
		{`{"dead_letter_config": {"maxDeliveryAttempts": 5000}}`, "dead_letter_config.maxDeliveryAttempts"},
		{`{"no_such_section": {}}`, "no_such_section"},
	} {
		code, body := c.do("PUT", "/v1/streams/"+s+"/config", adminToken, bad.body)
		require.Equal(t, http.StatusBadRequest, code, "%s: %v", bad.body, body)
		require.Contains(t, body["error"], bad.names, bad.body)
	}
	code, body := c.do("GET", "/v1/streams/"+s+"/config", adminToken, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Empty(t, body, "nothing written")

	code, body = c.do("PUT", "/v1/streams/"+s+"/config", aliceToken, `{"lifecycle_config": {"readOnly": true}}`)
	require.Equal(t, http.StatusForbidden, code, "%v", body)
	code, body = c.do("PUT", "/v1/streams/"+s+"/config", adminToken, `{"lifecycle_config": {"readOnly": true}, "performance_config": {"batchSize": 10}}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, map[string]any{"readOnly": true}, body["lifecycle_config"])

	code, body = c.do("POST", "/v1/streams/"+s+"/records", adminToken, `{"records":[{"data":{"n":1}}]}`)
	require.Equal(t, http.StatusBadRequest, code, "%v", body)
	require.Contains(t, body["error"], "read-only")
}
