package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/messages"
)

// selfSigned writes a certificate and key for 127.0.0.1 and returns their paths.
func selfSigned(t *testing.T) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "streamd-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	kb, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600))
	return certPath, keyPath
}

// TestServeTLSAndTokenFile: with a certificate, serve speaks HTTPS only; tokens from
// a token file map to their principals.
func TestServeTLSAndTokenFile(t *testing.T) {
	t.Parallel()
	certPath, keyPath := selfSigned(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("# principal token\nadmin admin-file-token-0123456789\nalice alice-file-token-0123456789\n"), 0o600))
	addr, cancel, done := serveInProcess(t, "--tls-cert", certPath, "--tls-key", keyPath,
		"--auth-token-file", tokens, "--coordinator-name", testdb.Name("tls-test"))
	pool := x509.NewCertPool()
	pemBytes, err := os.ReadFile(certPath)
	require.NoError(t, err)
	require.True(t, pool.AppendCertsFromPEM(pemBytes))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(token string) int {
		req, _ := http.NewRequest("GET", "https://"+addr+"/v1/streams", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Eventually(t, func() bool { return get("admin-file-token-0123456789") == http.StatusOK }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusForbidden, get("alice-file-token-0123456789"))
	require.Equal(t, http.StatusUnauthorized, get("nobody-token-0123456789"))
	_, err = http.Get("http://" + addr + "/healthz")
	require.NoError(t, err, "a plain HTTP request gets an answer (400), not a hang")
	cancel()
	require.NoError(t, <-done)
}

// TestServeConfigErrorsNameTheSetting: bad settings fail at start, naming the flag.
func TestServeConfigErrorsNameTheSetting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve"}, "--auth-token"},
		{[]string{"serve", "--auth-disabled", "--auth-token", "x-token-0123456789abc"}, "--auth-disabled"},
		{[]string{"serve", "--auth-disabled", "--tls-cert", "c.pem"}, "--tls-key"},
		{[]string{"serve", "--auth-disabled", "--http-addr", "nonsense"}, "--http-addr"},
		{[]string{"serve", "--auth-disabled", "--lease-ttl", "10ms"}, "--lease-ttl"},
		{[]string{"serve", "--auth-disabled", "--lease-ttl", "600h"}, "--lease-ttl"},
		{[]string{"serve", "--auth-disabled", "--max-request-bytes", "0"}, "--max-request-bytes"},
		{[]string{"serve", "--auth-token-file", "/nonexistent/tokens"}, "--auth-token-file"},
		{[]string{"serve", "--auth-token", "short"}, "shorter than 16"},
		{[]string{"--log-format", "xml", "stream", "list"}, "--log-format"},
	} {
		_, err := run(t, ctx, "", tc.args...)
		require.ErrorContains(t, err, tc.want, "%v", tc.args)
	}
}

// TestServeEnvironment: environment values parse whole and strictly, and a flag wins
// over its variable. $STREAMD_MAX_REQUEST_BYTES=8MiB used to read as 8 bytes (every
// request over 8 bytes then got a 413), $STREAMD_TAILER=0 or FALSE left the tailer on,
// and a bad variable stopped serve even when its flag was given.
func TestServeEnvironment(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		env, value string
		args       []string
		want       string
	}{
		{"STREAMD_MAX_REQUEST_BYTES", "8MiB", nil, "$STREAMD_MAX_REQUEST_BYTES"},
		{"STREAMD_MAX_REQUEST_BYTES", "1e6", nil, "$STREAMD_MAX_REQUEST_BYTES"},
		{"STREAMD_TAILER", "no", nil, "$STREAMD_TAILER"},
		{"STREAMD_AUTH_DISABLED", "yes", nil, "$STREAMD_AUTH_DISABLED"},
		// The flag is given: its variable is not read, whatever it holds; the error
		// is the next bad setting's.
		{"STREAMD_LEASE_TTL", "5", []string{"--lease-ttl", "5s"}, "--http-addr"},
		{"STREAMD_MAX_REQUEST_BYTES", "8MiB", []string{"--max-request-bytes", "1024"}, "--http-addr"},
	} {
		t.Run(tc.env+"="+tc.value, func(t *testing.T) {
			t.Setenv(tc.env, tc.value)
			args := append([]string{"serve", "--auth-disabled", "--http-addr", "nonsense"}, tc.args...)
			if tc.env == "STREAMD_AUTH_DISABLED" {
				args = []string{"serve", "--http-addr", "nonsense"}
			}
			_, err := run(t, ctx, "", args...)
			require.ErrorContains(t, err, tc.want)
		})
	}
	for value, want := range map[string]bool{"0": false, "FALSE": false, "false": false, "1": true, "true": true} {
		t.Setenv("STREAMD_TAILER", value)
		on, err := newServeCmd(&globals{}).Flags().GetBool("tailer")
		require.NoError(t, err)
		require.Equal(t, want, on, "STREAMD_TAILER=%s", value)
	}
}

// TestSplitList: --retention-streams and $STREAMD_RETENTION_STREAMS lists are trimmed,
// and an empty one means every stream (nil), not none; "a, b" used to keep " b",
// which matched no stream.
func TestSplitList(t *testing.T) {
	t.Parallel()
	require.Nil(t, splitList(""))
	require.Nil(t, splitList(" , "))
	require.Equal(t, []string{"a", "b"}, splitList("a, b,"))
}

// TestGaugesClearExportsNothing: when a term ends, the leader-only gauges go away,
// the refresh timestamp too: a follower exported the last (or a zero) timestamp, and a
// freshness alert fired on it.
func TestGaugesClearExportsNothing(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	pool := testdb.Pool(t)
	queues, err := messages.NewClient(pool, nil)
	require.NoError(t, err)
	g, err := newGauges(consumergroup.NewAdmin(pool), queues, reg)
	require.NoError(t, err)
	require.NoError(t, g.refresh(context.Background()))
	families, err := reg.Gather()
	require.NoError(t, err)
	require.True(t, slices.ContainsFunc(families, func(f *dto.MetricFamily) bool {
		return f.GetName() == "streamd_coordinator_gauges_updated_timestamp_seconds"
	}))
	g.clear()
	families, err = reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		require.Empty(t, f.GetMetric(), "%s after the term", f.GetName())
	}
}
