package kafka

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
)

// oauthClient is a franz-go client authenticating with OAUTHBEARER and token.
func oauthClient(t *testing.T, addr, token string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	return newClient(t, []string{addr}, append([]kgo.Opt{kgo.SASL(oauth.Auth{Token: token}.AsMechanism()),
		kgo.RequestRetries(1), kgo.RetryTimeout(5 * time.Second)}, opts...)...)
}

// OAUTHBEARER takes an API token as the bearer token: the connection is the token's
// principal (a reader may not produce); a token that is not one, or an unsecured JWT
// naming admin (which Kafka's default validator accepts), is refused with
// SASL_AUTHENTICATION_FAILED saying invalid_token.
func TestSASLOAuthBearerWithTheAPITokens(t *testing.T) {
	t.Parallel()
	ts, topic := authzSetup(t)
	ctx := testCtx(t)

	require.NoError(t, oauthClient(t, ts.addr, adminToken).Ping(ctx))
	reader := oauthClient(t, ts.addr, readerToken, kgo.DefaultProduceTopic(topic))
	require.NoError(t, reader.Ping(ctx))
	err := reader.ProduceSync(ctx, &kgo.Record{Value: []byte("refused")}).FirstErr()
	require.ErrorIs(t, err, kerr.TopicAuthorizationFailed, "the reader's token authenticates the reader")
	writer := oauthClient(t, ts.addr, writerToken, kgo.DefaultProduceTopic(topic))
	require.NoError(t, writer.ProduceSync(ctx, &kgo.Record{Value: []byte("written")}).FirstErr())
	require.Equal(t, 1, countEvents(t, ts, topic))

	enc := base64.RawURLEncoding.EncodeToString
	jwt := enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(`{"sub":"admin","exp":4102444800}`)) + "."
	for _, bad := range []string{badPassword, jwt} {
		err := oauthClient(t, ts.addr, bad).Ping(ctx)
		require.ErrorIs(t, err, kerr.SaslAuthenticationFailed, bad)
		require.Contains(t, err.Error(), "invalid_token")
	}
}

// The client's first message (RFC 7628): malformed ones are refused.
func TestParseOAuthBearer(t *testing.T) {
	t.Parallel()
	zid, tok, err := parseOAuthBearer([]byte("n,,\x01auth=Bearer abc\x01\x01"))
	require.NoError(t, err)
	require.Equal(t, "", zid)
	require.Equal(t, "abc", tok)
	zid, tok, err = parseOAuthBearer([]byte("n,a=rita,\x01host=h\x01auth=bearer xyz\x01port=9\x01\x01"))
	require.NoError(t, err)
	require.Equal(t, "rita", zid)
	require.Equal(t, "xyz", tok)
	for _, bad := range []string{
		"", "n,,", "y,,\x01auth=Bearer abc\x01\x01", "p=tls-unique,,\x01auth=Bearer abc\x01\x01",
		"n,,\x01auth=Basic abc\x01\x01", "n,,\x01auth=Bearer \x01\x01", "n,,\x01host=h\x01\x01",
		"n,,\x01auth=Bearer abc", "n,x=y,\x01auth=Bearer abc\x01\x01",
	} {
		_, _, err := parseOAuthBearer([]byte(bad))
		require.Error(t, err, "%q", strings.ReplaceAll(bad, "\x01", "^A"))
	}
}
