package kafka

import (
	"bytes"
	"fmt"
	"strings"
)

// SASL OAUTHBEARER (RFC 7628, Kafka's KIP-255) with the API tokens as bearer tokens:
// the client's first message carries "auth=Bearer <token>", and the token's
// principal (access.Tokens.Principal) is the connection's. streamd issues no JWTs and
// validates no signed ones: a token is one of Config.Tokens, exactly as PLAIN's
// password. Kafka's default validator accepts unsecured JWTs ({"alg":"none"}) whose
// "sub" claim names the principal; streamd does so only with
// Config.OAuthBearerUnsecured (serve's --kafka-sasl-oauthbearer-unsecured), for
// development, since anyone can then claim any principal (sasl_oauth_unsecured.go).
// A refused token is answered, as RFC 7628 says, with an error
// ({"status":"invalid_token"}, or "insufficient_scope" with the scope an unsecured
// token lacked); the client answers %x01 and the exchange fails with
// SASL_AUTHENTICATION_FAILED naming the status and why.

const mechanismOAuthBearer = "OAUTHBEARER"

func (a *saslAuth) oauthStep(x *saslExchange, msg []byte) (reply []byte, principal string, err error) {
	if x.oauthRefused != nil {
		// The client acknowledged the error (%x01): the exchange fails.
		return nil, "", fmt.Errorf("%w: %v", errSASLFailed, x.oauthRefused)
	}
	if x.steps != 1 {
		return nil, "", errSASLFailed
	}
	authzID, token, perr := parseOAuthBearer(msg)
	if perr != nil {
		return nil, "", fmt.Errorf("%w: %v", errSASLFailed, perr)
	}
	p, ok := a.tokens.Principal(token)
	var refused *oauthRefusal
	switch {
	case ok:
	case a.unsecured == nil:
		refused = invalidToken("the bearer token is not one of the server's API tokens")
	default:
		if p, refused = a.unsecured.validateUnsecured(token, a.now()); refused != nil {
			refused.reason = "the bearer token is not one of the server's API tokens, nor an acceptable unsecured JWT: " + refused.reason
		}
	}
	if refused == nil && authzID != "" && authzID != p {
		refused = invalidToken("the authorization id %q is not the token's principal", authzID)
	}
	if refused != nil {
		x.oauthRefused = refused
		return refused.reply(), "", nil
	}
	return []byte{}, p, nil
}

// parseOAuthBearer reads RFC 7628's client initial response: a GS2 header without
// channel binding ("n,", an optional "a=authzid", ","), then %x01-separated
// key=value pairs, among them "auth=Bearer <token>", ended by %x01%x01.
func parseOAuthBearer(msg []byte) (authzID, token string, err error) {
	header, rest, ok := bytes.Cut(msg, []byte{1})
	if !ok {
		return "", "", fmt.Errorf("an OAUTHBEARER message is a GS2 header, then key=value pairs separated by %%x01")
	}
	h := string(header)
	if !strings.HasPrefix(h, "n,") || !strings.HasSuffix(h, ",") {
		return "", "", fmt.Errorf("OAUTHBEARER: the GS2 header %q must be n,[a=authzid], (no channel binding)", h)
	}
	if zid := strings.TrimSuffix(strings.TrimPrefix(h, "n,"), ","); zid != "" {
		if !strings.HasPrefix(zid, "a=") {
			return "", "", fmt.Errorf("OAUTHBEARER: the GS2 header %q must be n,[a=authzid],", h)
		}
		authzID = zid[2:]
	}
	if !bytes.HasSuffix(rest, []byte{1, 1}) && !bytes.Equal(rest, []byte{1}) {
		return "", "", fmt.Errorf("OAUTHBEARER: the key=value pairs must end with %%x01%%x01")
	}
	for _, kv := range bytes.Split(bytes.TrimRight(rest, "\x01"), []byte{1}) {
		k, v, _ := bytes.Cut(kv, []byte("="))
		if string(k) != "auth" {
			continue // extensions (host, port, Kafka's) are not used
		}
		scheme, tok, ok := strings.Cut(string(v), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
			return "", "", fmt.Errorf("OAUTHBEARER: auth must be \"Bearer <token>\"")
		}
		token = tok
	}
	if token == "" {
		return "", "", fmt.Errorf("OAUTHBEARER: no auth=Bearer <token> pair")
	}
	return authzID, token, nil
}
