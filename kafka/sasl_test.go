package kafka

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"io"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/streamd/streamd/access"
	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
)

// The principals of the SASL tests: admin, a reader, a writer, one with two tokens
// (rotation) and one the streams grant nothing.
const (
	adminToken   = "admin-token-0123456789"
	readerToken  = "rita-token-0123456789"
	writerToken  = "wally-token-0123456789"
	rotateOld    = "otto-token-old-0123456"
	rotateNew    = "otto-token-new-0123456"
	nobodyToken  = "nobody-token-012345678"
	badPassword  = "not-a-token-0123456789"
	testReader   = "rita"
	testWriter   = "wally"
	testRotating = "otto"
	testNobody   = "nobody"
)

func testTokens() access.Tokens {
	return access.Tokens{adminToken: access.AdminPrincipal, readerToken: testReader, writerToken: testWriter,
		rotateOld: testRotating, rotateNew: testRotating, nobodyToken: testNobody}
}

// mechanisms are franz-go's SASL clients for a username and password.
var mechanisms = map[string]func(user, pass string) sasl.Mechanism{
	"PLAIN":         func(u, p string) sasl.Mechanism { return plain.Auth{User: u, Pass: p}.AsMechanism() },
	"SCRAM-SHA-256": func(u, p string) sasl.Mechanism { return scram.Auth{User: u, Pass: p}.AsSha256Mechanism() },
	"SCRAM-SHA-512": func(u, p string) sasl.Mechanism { return scram.Auth{User: u, Pass: p}.AsSha512Mechanism() },
}

// saslClient is a franz-go client authenticating as user with pass.
func saslClient(t *testing.T, addr, mechanism, user, pass string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	return newClient(t, []string{addr}, append([]kgo.Opt{kgo.SASL(mechanisms[mechanism](user, pass)),
		kgo.RequestRetries(1), kgo.RetryTimeout(5 * time.Second)}, opts...)...)
}

// Each mechanism: the principal's token is its password (either token of a principal
// that has two); a wrong password or an unknown principal is SASL_AUTHENTICATION_FAILED.
func TestSASLAuthenticatesWithTheAPITokens(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testdb.Pool(t), &Config{Tokens: testTokens()})
	for mech := range mechanisms {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			for _, good := range [][2]string{{testReader, readerToken}, {testRotating, rotateOld}, {testRotating, rotateNew},
				{access.AdminPrincipal, adminToken}} {
				cl := saslClient(t, ts.addr, mech, good[0], good[1])
				require.NoError(t, cl.Ping(ctx), "%s as %s", mech, good[0])
			}
			for _, bad := range [][2]string{{testReader, badPassword}, {testReader, writerToken}, {"nosuchuser", readerToken}} {
				cl := saslClient(t, ts.addr, mech, bad[0], bad[1])
				err := cl.Ping(ctx)
				require.ErrorIs(t, err, kerr.SaslAuthenticationFailed, "%s as %s with a bad password", mech, bad[0])
			}
		})
	}
}

// Before authenticating, a client may send ApiVersions and the SASL APIs only: any
// other request closes the connection, unanswered; so does a mechanism not offered.
// Without Tokens the SASL APIs are not offered at all.
func TestRequestsBeforeSASLCloseTheConnection(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ts := startServer(t, pool, &Config{Tokens: testTokens()})
	formatter := kmsg.NewRequestFormatter(kmsg.FormatterClientID("raw"))

	c := rawConn(t, ts.addr)
	versions := kmsg.NewPtrApiVersionsRequest()
	versions.SetVersion(3)
	resp := roundTrip(t, c, formatter, versions).(*kmsg.ApiVersionsResponse)
	keys := map[int16]bool{}
	for _, k := range resp.ApiKeys {
		keys[k.ApiKey] = true
	}
	require.True(t, keys[17] && keys[36], "SaslHandshake and SaslAuthenticate are offered")
	meta := kmsg.NewPtrMetadataRequest()
	meta.SetVersion(9)
	_, err := c.Write(formatter.AppendRequest(nil, meta, 2))
	require.NoError(t, err)
	requireClosed(t, c)

	c = rawConn(t, ts.addr)
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.SetVersion(1)
	hs.Mechanism = "GSSAPI"
	hsResp := roundTrip(t, c, formatter, hs).(*kmsg.SASLHandshakeResponse)
	require.Equal(t, kerr.UnsupportedSaslMechanism.Code, hsResp.ErrorCode)
	require.Equal(t, saslMechanisms, hsResp.SupportedMechanisms)
	requireClosed(t, c)

	// A frame larger than Kafka's pre-authentication bound closes the connection
	// unread (MaxRequestBytes is for authenticated clients).
	c = rawConn(t, ts.addr)
	_, err = c.Write(binary.BigEndian.AppendUint32(nil, preAuthMaxBytes+1))
	require.NoError(t, err)
	requireClosed(t, c)

	open := startServer(t, pool, nil)
	adm := newAdmin(t, open.addr)
	vers, err := adm.ApiVersions(testCtx(t))
	require.NoError(t, err)
	for _, bv := range vers {
		_, _, ok := bv.KeyVersions(17)
		require.False(t, ok, "a server without Tokens does not offer SASL")
	}
}

// roundTrip sends req on c and decodes the answer.
func roundTrip(t *testing.T, c net.Conn, f *kmsg.RequestFormatter, req kmsg.Request) kmsg.Response {
	t.Helper()
	_, err := c.Write(f.AppendRequest(nil, req, 1))
	require.NoError(t, err)
	var size [4]byte
	_, err = io.ReadFull(c, size[:])
	require.NoError(t, err)
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	_, err = io.ReadFull(c, body)
	require.NoError(t, err)
	resp := req.ResponseKind()
	skip := 4
	if resp.IsFlexible() && req.Key() != 18 {
		skip++ // the response header's empty tag section
	}
	require.NoError(t, resp.ReadFrom(body[skip:]))
	return resp
}

// selfSigned is a TLS certificate for 127.0.0.1 and the pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "streamd test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, roots
}

// SASL_SSL: over TLS with a self-signed certificate, a SCRAM client produces and
// consumes; a plaintext client gets no answer.
func TestSASLOverTLS(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	cert, roots := selfSigned(t)
	ts := startServer(t, pool, &Config{Tokens: testTokens(), TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	ctx := testCtx(t)
	topic := testdb.Name("tls")
	require.NoError(t, streams.NewClient(pool, nil).CreateStream(ctx, topic, 1))
	require.NoError(t, streamconfig.NewStore(pool).Set(ctx, topic, &streamconfig.Config{AccessControl: &streamconfig.AccessControl{
		Readers: []string{testReader}, Writers: []string{testReader}}}))

	tlsOpt := kgo.DialTLSConfig(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})
	prod := saslClient(t, ts.addr, "SCRAM-SHA-512", testReader, readerToken, tlsOpt, kgo.DefaultProduceTopic(topic))
	require.NoError(t, prod.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte("over tls")}).FirstErr())
	cons := saslClient(t, ts.addr, "SCRAM-SHA-256", testReader, readerToken, tlsOpt, kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	fs := cons.PollFetches(ctx)
	require.NoError(t, fs.Err())
	require.Len(t, fs.Records(), 1)
	require.Equal(t, []byte("over tls"), fs.Records()[0].Value)

	// A plaintext ApiVersions is not a TLS ClientHello: the server closes.
	c := rawConn(t, ts.addr)
	_, err := c.Write(kmsg.NewRequestFormatter().AppendRequest(nil, kmsg.NewPtrApiVersionsRequest(), 1))
	require.NoError(t, err)
	buf := make([]byte, 512)
	n, err := io.ReadFull(c, buf)
	require.Error(t, err, "a plaintext client got %d bytes", n)
}

// The listener name follows the security, as Kafka names listeners; bad Tokens are
// refused naming the field.
func TestSecurityConfig(t *testing.T) {
	t.Parallel()
	cert, _ := selfSigned(t)
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "PLAINTEXT"},
		{Config{TLS: tlsCfg}, "SSL"},
		{Config{Tokens: testTokens()}, "SASL_PLAINTEXT"},
		{Config{TLS: tlsCfg, Tokens: testTokens()}, "SASL_SSL"},
		{Config{TLS: tlsCfg, Tokens: testTokens(), Listener: "INTERNAL"}, "INTERNAL"},
	} {
		c, err := tc.cfg.withDefaults()
		require.NoError(t, err)
		require.Equal(t, tc.want, c.Listener)
	}
	_, err := (&Config{Tokens: access.Tokens{}}).withDefaults()
	require.ErrorContains(t, err, "Config.Tokens is empty")
	_, err = (&Config{Tokens: access.Tokens{"short": "x"}}).withDefaults()
	require.ErrorContains(t, err, "Config.Tokens")
}

// SaslHandshake v0: the SASL messages follow as bare size-prefixed frames, answered
// the same way (PLAIN's answer is empty); then the connection is the principal's. A
// wrong password closes the connection unanswered.
func TestSASLHandshakeV0BareFrames(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testdb.Pool(t), &Config{Tokens: testTokens()})
	formatter := kmsg.NewRequestFormatter(kmsg.FormatterClientID("v0"))
	readFrame := func(c net.Conn) []byte {
		var size [4]byte
		_, err := io.ReadFull(c, size[:])
		require.NoError(t, err)
		body := make([]byte, binary.BigEndian.Uint32(size[:]))
		_, err = io.ReadFull(c, body)
		require.NoError(t, err)
		return body
	}
	handshake := func(c net.Conn) {
		hs := kmsg.NewPtrSASLHandshakeRequest()
		hs.SetVersion(0)
		hs.Mechanism = "PLAIN"
		resp := roundTrip(t, c, formatter, hs).(*kmsg.SASLHandshakeResponse)
		require.Zero(t, resp.ErrorCode)
	}

	c := rawConn(t, ts.addr)
	handshake(c)
	_, err := c.Write(frame([]byte("\x00" + testReader + "\x00" + readerToken)))
	require.NoError(t, err)
	require.Empty(t, readFrame(c), "PLAIN's answer is an empty frame")
	meta := kmsg.NewPtrMetadataRequest()
	meta.SetVersion(9)
	md := roundTrip(t, c, formatter, meta).(*kmsg.MetadataResponse)
	require.NotEmpty(t, md.Brokers, "authenticated: Metadata is served")

	c = rawConn(t, ts.addr)
	handshake(c)
	_, err = c.Write(frame([]byte("\x00" + testReader + "\x00" + badPassword)))
	require.NoError(t, err)
	requireClosed(t, c)
}
