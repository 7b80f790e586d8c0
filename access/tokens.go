// Package access is who a client is and what it may do with streams, for every door
// that authenticates clients (the HTTP API's bearer tokens, the Kafka listener's
// SASL). Tokens maps secrets to principals; Authorizer decides from each stream's
// access_control_config (streamconfig.AccessControl): AdminPrincipal may do
// everything, any other principal what the stream grants it.
package access

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
)

// AdminPrincipal may do everything, on every stream and without one.
const AdminPrincipal = "admin"

// MinTokenLength is the shortest token Tokens.Validate accepts.
const MinTokenLength = 16

// Tokens maps secret tokens to the principals they authenticate. A principal may
// have several tokens (to rotate them). The HTTP API takes a token as a bearer
// token; the Kafka listener as the SASL password of the principal (its username).
type Tokens map[string]string

// Validate fails (naming the principal, never the token) when a token is shorter
// than MinTokenLength or maps to an empty principal.
func (t Tokens) Validate() error {
	for tok, p := range t {
		if p == "" {
			return errors.New("a token maps to an empty principal")
		}
		if len(tok) < MinTokenLength {
			return fmt.Errorf("the token of principal %q is shorter than %d characters", p, MinTokenLength)
		}
	}
	return nil
}

// Principal returns the principal token authenticates. It compares token with every
// token in constant time, so the time taken tells nothing about which one is near.
func (t Tokens) Principal(token string) (string, bool) {
	found := ""
	for tok, p := range t {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(token)) == 1 {
			found = p
		}
	}
	return found, found != ""
}

// Check reports whether token is one of principal's tokens (SASL PLAIN: a username and
// its password), comparing in constant time as Principal does.
func (t Tokens) Check(principal, token string) bool {
	p, ok := t.Principal(token)
	return ok && subtle.ConstantTimeCompare([]byte(p), []byte(principal)) == 1
}

// Of returns principal's tokens, sorted (none for an unknown principal).
func (t Tokens) Of(principal string) []string {
	var out []string
	for tok, p := range t {
		if p == principal {
			out = append(out, tok)
		}
	}
	slices.Sort(out)
	return out
}

// Principals returns the principals that have a token, sorted.
func (t Tokens) Principals() []string {
	var out []string
	for _, p := range t {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}
