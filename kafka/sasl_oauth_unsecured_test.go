package kafka

import (
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/internal/testdb"
	"github.com/streamd/streamd/streamconfig"
)

// unsecuredJWT is an unsecured JWS (RFC 7519 section 6): header {"alg":"none"},
// claims, an empty signature, as franz-go's kgo suite and Kafka's unsecured login
// module build them.
func unsecuredJWT(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(claims)) + "."
}

// With Config.OAuthBearerUnsecured, OAUTHBEARER accepts an unsecured JWT as Kafka's
// default validator does, the principal being its "sub" (a reader's token cannot
// produce); without it the same token is refused. An expired token, one issued in
// the future, a signed one and one without "sub" are refused with invalid_token; a
// token without the required scope with insufficient_scope. The API tokens still
// authenticate.
func TestSASLOAuthBearerUnsecuredJWT(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	plain := startServer(t, pool, &Config{Tokens: testTokens()})
	ts := startServer(t, pool, &Config{Tokens: testTokens(), OAuthBearerUnsecured: &OAuthBearerUnsecured{}})
	scoped := startServer(t, pool, &Config{Tokens: testTokens(),
		OAuthBearerUnsecured: &OAuthBearerUnsecured{RequiredScope: []string{"streamd"}}})
	topic := testdb.Name("unsecured")
	createTopic(t, ts, topic, &streamconfig.AccessControl{Readers: []string{testReader}, Writers: []string{testWriter}})
	ctx := testCtx(t)
	in := func(d time.Duration) int64 { return time.Now().Add(d).Unix() }

	admin := unsecuredJWT(fmt.Sprintf(`{"sub":"admin","exp":%d}`, in(time.Hour)))
	err := oauthClient(t, plain.addr, admin).Ping(ctx)
	require.ErrorIs(t, err, kerr.SaslAuthenticationFailed, "refused without the option")
	require.Contains(t, err.Error(), "invalid_token")

	require.NoError(t, oauthClient(t, ts.addr, admin).Ping(ctx))
	require.NoError(t, oauthClient(t, ts.addr, adminToken).Ping(ctx), "the API tokens still authenticate")
	reader := oauthClient(t, ts.addr, unsecuredJWT(fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d}`, testReader, in(-time.Minute), in(time.Hour))),
		kgo.DefaultProduceTopic(topic))
	require.NoError(t, reader.Ping(ctx))
	err = reader.ProduceSync(ctx, &kgo.Record{Value: []byte("refused")}).FirstErr()
	require.ErrorIs(t, err, kerr.TopicAuthorizationFailed, "the token's sub is the principal")
	writer := oauthClient(t, ts.addr, unsecuredJWT(fmt.Sprintf(`{"sub":%q,"exp":%d}`, testWriter, in(time.Hour))),
		kgo.DefaultProduceTopic(topic))
	require.NoError(t, writer.ProduceSync(ctx, &kgo.Record{Value: []byte("written")}).FirstErr())
	require.Equal(t, 1, countEvents(t, ts, topic))

	enc := base64.RawURLEncoding.EncodeToString
	for what, bad := range map[string]string{
		"expired":          unsecuredJWT(fmt.Sprintf(`{"sub":"admin","exp":%d}`, in(-time.Minute))),
		"issued in future": unsecuredJWT(fmt.Sprintf(`{"sub":"admin","iat":%d,"exp":%d}`, in(time.Minute), in(time.Hour))),
		"no exp":           unsecuredJWT(`{"sub":"admin"}`),
		"no sub":           unsecuredJWT(fmt.Sprintf(`{"exp":%d}`, in(time.Hour))),
		"signed":           enc([]byte(`{"alg":"HS256"}`)) + "." + enc([]byte(fmt.Sprintf(`{"sub":"admin","exp":%d}`, in(time.Hour)))) + ".c2ln",
		"not a JWT":        badPassword,
	} {
		err := oauthClient(t, ts.addr, bad).Ping(ctx)
		require.ErrorIs(t, err, kerr.SaslAuthenticationFailed, what)
		require.Contains(t, err.Error(), "invalid_token", what)
	}

	err = oauthClient(t, scoped.addr, admin).Ping(ctx)
	require.ErrorIs(t, err, kerr.SaslAuthenticationFailed, "no scope")
	require.Contains(t, err.Error(), "insufficient_scope")
	require.NoError(t, oauthClient(t, scoped.addr, unsecuredJWT(fmt.Sprintf(`{"sub":"admin","scope":["other","streamd"],"exp":%d}`, in(time.Hour)))).Ping(ctx))
}

// Kafka's unsecured validator's checks, one by one, at a fixed time.
func TestValidateUnsecuredJWT(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) int64 { return now.Add(d).Unix() }
	o, err := OAuthBearerUnsecured{AllowableClockSkew: 30 * time.Second, RequiredScope: []string{" a ", ""}}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, o.RequiredScope)
	enc := base64.RawURLEncoding.EncodeToString
	for _, tc := range []struct {
		token, status, principal string
	}{
		{token: unsecuredJWT(fmt.Sprintf(`{"sub":"rita","exp":%d,"scope":"a"}`, at(time.Hour))), principal: "rita"},
		{token: unsecuredJWT(fmt.Sprintf(`{"sub":"rita","exp":%d,"scope":["a","b"]}`, at(-20*time.Second))), principal: "rita"},                  // within the skew
		{token: unsecuredJWT(fmt.Sprintf(`{"sub":"rita","exp":%d,"iat":%d,"scope":"a"}`, at(time.Hour), at(20*time.Second))), principal: "rita"}, // within the skew
		{token: unsecuredJWT(fmt.Sprintf(`{"sub":"rita","exp":%d,"scope":"a"}`, at(-30*time.Second))), status: "invalid_token"},
		{token: unsecuredJWT(fmt.Sprintf(`{"sub":"rita","exp":%d,"iat":%d,"scope":"a"}`, at(time.Hour), at(time.Minute))), status: "invalid_token"},
		{token: unsecuredJWT(fmt.Sprintf(`{"sub":"rita","exp":%d,"iat":%d,"scope":"a"}`, at(time.Minute), at(time.Minute))), status: "invalid_token"},
		{token: unsecuredJWT(fmt.Sprintf(`{"sub":"rita","exp":"%d","scope":"a"}`, at(time.Hour))), status: "invalid_token"},
		{token: unsecuredJWT(fmt.Sprintf(`{"sub":7,"exp":%d,"scope":"a"}`, at(time.Hour))), status: "invalid_token"},
		{token: unsecuredJWT(fmt.Sprintf(`{"sub":" ","exp":%d,"scope":"a"}`, at(time.Hour))), status: "invalid_token"},
		{token: unsecuredJWT(fmt.Sprintf(`{"sub":"rita","exp":%d,"scope":"a b"}`, at(time.Hour))), status: "insufficient_scope"}, // one scope, "a b"
		{token: unsecuredJWT(fmt.Sprintf(`{"sub":"rita","exp":%d}`, at(time.Hour))), status: "insufficient_scope"},
		{token: enc([]byte(`{}`)) + "." + enc([]byte(fmt.Sprintf(`{"sub":"rita","exp":%d,"scope":"a"}`, at(time.Hour)))) + ".", status: "invalid_token"},
		{token: unsecuredJWT(fmt.Sprintf(`{"sub":"rita","exp":%d,"scope":"a"}`, at(time.Hour))) + "sig", status: "invalid_token"},
		{token: "a..b", status: "invalid_token"},
		{token: "e30.e30", status: "invalid_token"},
		{token: "!!.e30.", status: "invalid_token"},
		{token: enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(`[1]`)) + ".", status: "invalid_token"},
	} {
		p, refused := o.validateUnsecured(tc.token, now)
		if tc.status == "" {
			require.Nil(t, refused, tc.token)
			require.Equal(t, tc.principal, p)
			continue
		}
		require.NotNil(t, refused, tc.token)
		require.Equal(t, tc.status, refused.status, "%s: %v", tc.token, refused)
	}
	_, err = OAuthBearerUnsecured{AllowableClockSkew: -time.Second}.withDefaults()
	require.ErrorContains(t, err, "AllowableClockSkew")
	_, err = New(testdb.Pool(t), &Config{OAuthBearerUnsecured: &OAuthBearerUnsecured{}})
	require.ErrorContains(t, err, "OAuthBearerUnsecured needs Tokens")
}
