package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/streamd/streamd/internal/testdb"
)

// streamd serve with tokens and a certificate: the Kafka listener may bind every
// interface, speaks TLS with --tls-cert/--tls-key and authenticates the token file's
// principals with SASL; a token the file does not give is refused.
func TestServeKafkaSASLOverTLS(t *testing.T) {
	t.Parallel()
	ctx, cancelCtx := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancelCtx()
	certPath, keyPath := selfSigned(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("admin kafka-admin-token-0123456789\nalice kafka-alice-token-0123456789\n"), 0o600))
	_, port, err := net.SplitHostPort(freeAddr(t))
	require.NoError(t, err)
	kafkaAddr := "127.0.0.1:" + port
	_, cancel, done := serveInProcess(t, "--tls-cert", certPath, "--tls-key", keyPath, "--auth-token-file", tokens,
		"--coordinator-name", testdb.Name("kafka-sasl"), "--kafka-addr", "0.0.0.0:"+port, "--kafka-advertised-addr", kafkaAddr)
	defer cancel()

	pem, err := os.ReadFile(certPath)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pem))
	client := func(user, pass string, opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(kafkaAddr),
			kgo.DialTLSConfig(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}),
			kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()), kgo.RequestRetries(1)}, opts...)...)
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		return cl
	}

	topic := testdb.Name("serve-sasl")
	admin := client("admin", "kafka-admin-token-0123456789", kgo.DefaultProduceTopic(topic))
	adm := kadm.NewClient(admin)
	require.Eventually(t, func() bool {
		_, err := adm.CreateTopic(ctx, 1, 1, nil, topic)
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "serve's Kafka listener comes up")
	require.NoError(t, admin.ProduceSync(ctx, &kgo.Record{Value: []byte("over sasl_ssl")}).FirstErr())

	alice := client("alice", "kafka-alice-token-0123456789", kgo.DefaultProduceTopic(topic))
	require.ErrorIs(t, alice.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(), kerr.TopicAuthorizationFailed,
		"alice has no grant on the stream")
	stranger := client("alice", "kafka-wrong-token-0123456789")
	require.ErrorIs(t, stranger.Ping(ctx), kerr.SaslAuthenticationFailed)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
}
