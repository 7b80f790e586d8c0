package kafka

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/streamd/streamd/access"
)

// SASL (SaslHandshake + SaslAuthenticate, or v0's bare frames) with the principals of
// Config.Tokens: the username is the principal, the password one of its tokens.
// Mechanisms: PLAIN and SCRAM-SHA-256/512 (scram.go). SCRAM's stored keys are
// derived from the tokens when the Server is made, under a salt of its own per
// principal: the tokens stay the one secret, nothing is stored.

// saslMechanisms are the mechanisms SaslHandshake offers, in its order.
var saslMechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", mechanismOAuthBearer}

// scramIterations is SCRAM's PBKDF2 iteration count (Kafka's minimum, RFC 7677's
// recommendation).
const scramIterations = 4096

// preAuthMaxBytes bounds a request frame before authentication (Kafka's
// sasl.server.max.receive.size): an unauthenticated client cannot make the server
// read MaxRequestBytes.
const preAuthMaxBytes = 512 << 10

// errSASLFailed: authentication failed. Its text is sent to the client, so it never
// says whether the principal exists.
var errSASLFailed = errors.New("authentication failed: invalid credentials")

// saslAuth holds what the server needs to authenticate: the tokens (PLAIN) and each
// SCRAM mechanism's stored credentials. Built once by New; read-only after.
type saslAuth struct {
	tokens access.Tokens
	scram  map[string]*scramCredentials
	// fakeKey derives the salt of an unknown principal, so that a SCRAM exchange for a
	// principal that does not exist looks like one that does.
	fakeKey []byte
	// unsecured, when set, makes OAUTHBEARER accept unsecured JWTs
	// (Config.OAuthBearerUnsecured); now is their clock (tests move it).
	unsecured *OAuthBearerUnsecured
	now       func() time.Time
}

// scramCredentials are one SCRAM mechanism's stored credentials: a principal's, one
// per token (rotation), all under the principal's salt.
type scramCredentials struct {
	hash        scramHash
	byPrincipal map[string][]scramCredential
}

func newSASLAuth(tokens access.Tokens, unsecured *OAuthBearerUnsecured) (*saslAuth, error) {
	a := &saslAuth{tokens: tokens, scram: map[string]*scramCredentials{}, fakeKey: make([]byte, 32),
		unsecured: unsecured, now: time.Now}
	_, _ = rand.Read(a.fakeKey)
	salts := map[string][]byte{}
	for _, p := range tokens.Principals() {
		salts[p] = make([]byte, 16)
		_, _ = rand.Read(salts[p])
	}
	for _, h := range []scramHash{scramSHA256, scramSHA512} {
		sc := &scramCredentials{hash: h, byPrincipal: map[string][]scramCredential{}}
		for p, salt := range salts {
			for _, tok := range tokens.Of(p) {
				c, err := h.credential(tok, salt, scramIterations)
				if err != nil {
					return nil, fmt.Errorf("kafka: Config.Tokens: the %s credential of principal %q: %v", h.name, p, err)
				}
				sc.byPrincipal[p] = append(sc.byPrincipal[p], c)
			}
		}
		a.scram[h.name] = sc
	}
	return a, nil
}

// saslExchange is one connection's authentication in progress, from SaslHandshake to
// the SaslAuthenticate that ends it. Used by the connection's serve goroutine only.
type saslExchange struct {
	mechanism string
	// scram is SCRAM's exchange (nil for PLAIN).
	scram *scramServer
	// steps counts the messages taken (SCRAM has two).
	steps int
	// raw: started by SaslHandshake v0, the messages come as bare frames.
	raw bool
	// oauthRefused: OAUTHBEARER refused the token and sent its error; the client's
	// next message (%x01) ends the exchange with it.
	oauthRefused *oauthRefusal
}

func (a *saslAuth) start(mechanism string) *saslExchange {
	x := &saslExchange{mechanism: mechanism}
	if sc := a.scram[mechanism]; sc != nil {
		x.scram = &scramServer{hash: sc.hash, serverNonce: newServerNonce(),
			lookup:   func(user string) []scramCredential { return sc.byPrincipal[user] },
			fakeSalt: a.unknownSalt}
	}
	return x
}

// unknownSalt is the salt shown for a principal that does not exist: a function of
// the name, so that probing names tells nothing.
func (a *saslAuth) unknownSalt(user string) []byte {
	mac := hmac.New(sha256.New, a.fakeKey)
	mac.Write([]byte(user))
	return mac.Sum(nil)[:16]
}

// step takes the client's next SASL message. It returns the server's answer and, when
// the exchange is done, the authenticated principal; or errSASLFailed (the exchange
// is over).
func (a *saslAuth) step(x *saslExchange, msg []byte) (reply []byte, principal string, err error) {
	x.steps++
	if x.mechanism == mechanismOAuthBearer {
		return a.oauthStep(x, msg)
	}
	if x.scram == nil { // PLAIN
		// authzid NUL authcid NUL password (RFC 4616); Kafka takes an authzid only if
		// it is the authcid.
		parts := bytes.Split(msg, []byte{0})
		if len(parts) != 3 {
			return nil, "", fmt.Errorf("%w: a PLAIN message is authzid NUL username NUL password", errSASLFailed)
		}
		user, pass := string(parts[1]), string(parts[2])
		if len(parts[0]) > 0 && string(parts[0]) != user {
			return nil, "", fmt.Errorf("%w: an authorization id other than the username is not supported", errSASLFailed)
		}
		if user == "" || !a.tokens.Check(user, pass) {
			return nil, "", errSASLFailed
		}
		return []byte{}, user, nil
	}
	switch x.steps {
	case 1:
		out, err := x.scram.first(string(msg))
		if err != nil {
			return nil, "", fmt.Errorf("%w: %v", errSASLFailed, err)
		}
		return []byte(out), "", nil
	case 2:
		out, err := x.scram.final(string(msg))
		if err != nil {
			return nil, "", errSASLFailed // never why: a bad proof and an unknown principal look alike
		}
		if id := x.scram.authzID; id != "" && id != x.scram.user {
			return nil, "", fmt.Errorf("%w: an authorization id other than the username is not supported", errSASLFailed)
		}
		return []byte(out), x.scram.user, nil
	}
	return nil, "", errSASLFailed
}

// rawSASL takes one SASL message of an exchange SaslHandshake v0 started, sent as a
// bare frame, and returns the answer to send the same way (empty for PLAIN's). A
// failure closes the connection without an answer, as Kafka does for v0.
func (c *conn) rawSASL(msg []byte) ([]byte, error) {
	mechanism := c.sasl.mechanism
	reply, principal, err := c.s.auth.step(c.sasl, msg)
	if err != nil {
		c.sasl = nil
		c.s.metrics.saslFailures.Inc()
		c.s.logger.Warn("kafka SASL authentication failed", "remote", c.remote, "mechanism", mechanism, "framing", "v0")
		return nil, err
	}
	if principal != "" {
		c.sasl = nil
		c.principal = principal
		c.authenticated.Store(true)
		c.s.logger.Debug("kafka SASL authenticated", "remote", c.remote, "mechanism", mechanism, "principal", principal)
	}
	return reply, nil
}
