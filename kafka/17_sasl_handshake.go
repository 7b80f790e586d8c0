package kafka

import (
	"context"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// SaslHandshake v0 and v1. v1 (KIP-152): the SASL messages follow in
// SaslAuthenticate requests. v0: they follow as bare size-prefixed frames, answered
// the same way (conn.rawSASL); librdkafka needs v0 listed to use SASL at all, and
// kafka-python 2.0 speaks it. In the handler table only when Config.Tokens is set. A mechanism not offered, or a handshake on a connection that has one under way
// or is authenticated (re-authentication, KIP-368, is declined), is answered and then
// the connection closes, as Kafka does.
var saslHandshakeHandler = handler{key: 17, min: 0, max: 1, fn: handleSASLHandshake}

func handleSASLHandshake(_ context.Context, r *request) (kmsg.Response, error) {
	req := r.kreq.(*kmsg.SASLHandshakeRequest)
	resp := req.ResponseKind().(*kmsg.SASLHandshakeResponse)
	resp.SupportedMechanisms = saslMechanisms
	c := r.c
	switch {
	case c.authenticated.Load() || c.sasl != nil:
		resp.ErrorCode = kerr.IllegalSaslState.Code
		c.closeAfterResponse = true
	case !slices.Contains(saslMechanisms, req.Mechanism):
		resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
		c.closeAfterResponse = true
	default:
		c.sasl = r.s.auth.start(req.Mechanism)
		c.sasl.raw = req.Version == 0
	}
	return resp, nil
}
