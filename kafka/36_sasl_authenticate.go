package kafka

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// SaslAuthenticate v0 to v2: one SASL message of the exchange SaslHandshake started
// (PLAIN: one; SCRAM: two). When the exchange succeeds the connection is the
// principal's, for its lifetime: the session lifetime reported is 0, so clients do
// not re-authenticate (KIP-368 declined). A failure is SASL_AUTHENTICATION_FAILED,
// then the connection closes.
var saslAuthenticateHandler = handler{key: 36, min: 0, max: 2, fn: handleSASLAuthenticate}

func handleSASLAuthenticate(_ context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.SASLAuthenticateRequest)
	resp := req.ResponseKind().(*kmsg.SASLAuthenticateResponse)
	resp.SASLAuthBytes = []byte{}
	c := r.c
	if c.sasl == nil || c.authenticated.Load() {
		msg := "SaslAuthenticate without a SaslHandshake under way"
		resp.ErrorCode, resp.ErrorMessage = kerr.IllegalSaslState.Code, &msg
		c.closeAfterResponse = true
		return resp, nil
	}
	mechanism := c.sasl.mechanism
	reply, principal, err := r.s.auth.step(c.sasl, req.SASLAuthBytes)
	if err != nil {
		c.sasl = nil
		msg := err.Error() + " (SASL mechanism " + mechanism + ")"
		resp.ErrorCode, resp.ErrorMessage = kerr.SaslAuthenticationFailed.Code, &msg
		c.closeAfterResponse = true
		r.s.metrics.saslFailures.Inc()
		r.s.logger.Warn("kafka SASL authentication failed", "remote", c.remote, "mechanism", mechanism)
		return resp, nil
	}
	resp.SASLAuthBytes = reply
	if principal != "" {
		c.sasl = nil
		c.principal = principal
		c.authenticated.Store(true)
		r.s.logger.Debug("kafka SASL authenticated", "remote", c.remote, "mechanism", mechanism, "principal", principal)
	}
	return resp, nil
}
