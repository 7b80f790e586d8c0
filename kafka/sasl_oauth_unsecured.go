package kafka

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Unsecured JWTs over OAUTHBEARER, for development, as Apache Kafka's default
// OAUTHBEARER server handler (OAuthBearerUnsecuredValidatorCallbackHandler with
// OAuthBearerUnsecuredJws) accepts them: a token of three dot-separated parts, a
// header whose "alg" is "none", a JSON claims set, an empty signature. The checks
// are Kafka's: the principal claim ("sub") is a non-blank string; "exp" is a number
// and the token has not expired (now - skew < exp); "iat", when present, is a number
// not in the future (iat <= now + skew) and before "exp"; the scope claim (a string,
// one scope, or a list of strings) holds every required scope. Nothing is signed, so
// the client chooses its principal: Config.OAuthBearerUnsecured is off by default.

// OAuthBearerUnsecured configures the unsecured JWTs that SASL OAUTHBEARER accepts
// besides the API tokens (Config.OAuthBearerUnsecured), with the options of Kafka's
// unsecured validator (unsecuredValidator*). Fields are alphabetical.
type OAuthBearerUnsecured struct {
	// AllowableClockSkew is the slack allowed on "exp" and "iat"
	// (unsecuredValidatorAllowableClockSkewMs). Must not be negative. Defaults to 0.
	AllowableClockSkew time.Duration
	// PrincipalClaim is the claim naming the principal
	// (unsecuredValidatorPrincipalClaimName). Defaults to "sub".
	PrincipalClaim string
	// RequiredScope are the scopes a token must hold (unsecuredValidatorRequiredScope);
	// a token without one of them is refused with insufficient_scope. Defaults to
	// none.
	RequiredScope []string
	// ScopeClaim is the claim holding the token's scope
	// (unsecuredValidatorScopeClaimName). Defaults to "scope".
	ScopeClaim string
}

func (o OAuthBearerUnsecured) withDefaults() (OAuthBearerUnsecured, error) {
	o.PrincipalClaim = strings.TrimSpace(o.PrincipalClaim)
	if o.PrincipalClaim == "" {
		o.PrincipalClaim = "sub"
	}
	o.ScopeClaim = strings.TrimSpace(o.ScopeClaim)
	if o.ScopeClaim == "" {
		o.ScopeClaim = "scope"
	}
	if o.AllowableClockSkew < 0 {
		return o, fmt.Errorf("kafka: Config.OAuthBearerUnsecured.AllowableClockSkew %v must not be negative", o.AllowableClockSkew)
	}
	var scope []string
	for _, s := range o.RequiredScope {
		if s = strings.TrimSpace(s); s != "" {
			scope = append(scope, s)
		}
	}
	o.RequiredScope = scope
	return o, nil
}

// oauthRefusal is why an unsecured token was refused: RFC 7628's status
// ("invalid_token" or "insufficient_scope"), the scope it lacked, and the reason
// (for the log and the client's final error, as Kafka's message says it).
type oauthRefusal struct {
	status string
	scope  string
	reason string
}

func (r *oauthRefusal) Error() string { return r.status + ": " + r.reason }

// reply is the server's error message of RFC 7628 section 3.2.2.
func (r *oauthRefusal) reply() []byte {
	msg := map[string]string{"status": r.status}
	if r.scope != "" {
		msg["scope"] = r.scope
	}
	out, _ := json.Marshal(msg)
	return out
}

func invalidToken(format string, args ...any) *oauthRefusal {
	return &oauthRefusal{status: "invalid_token", reason: fmt.Sprintf(format, args...)}
}

// validateUnsecured checks token as an unsecured JWT at now and returns its
// principal, or why it is refused.
func (o *OAuthBearerUnsecured) validateUnsecured(token string, now time.Time) (string, *oauthRefusal) {
	if strings.Contains(token, "..") {
		return "", invalidToken("malformed compact serialization contains '..'")
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", invalidToken("an unsecured JWS has 3 dot-separated Base64URL-encoded parts, not %d", len(parts))
	}
	header, err := jwtPart(parts[0])
	if err != nil {
		return "", invalidToken("the header: %v", err)
	}
	claims, err := jwtPart(parts[1])
	if err != nil {
		return "", invalidToken("the claims: %v", err)
	}
	if alg, _ := header["alg"].(string); alg != "none" {
		return "", invalidToken("an unsecured JWS must have 'none' for an algorithm")
	}
	if parts[2] != "" {
		return "", invalidToken("an unsecured JWS must not contain a digital signature")
	}
	var principal string
	switch p := claims[o.PrincipalClaim].(type) {
	case nil:
		return "", invalidToken("required claim missing: %s", o.PrincipalClaim)
	case string:
		principal = strings.TrimSpace(p)
	default:
		return "", invalidToken("the %s claim is not a string", o.PrincipalClaim)
	}
	if principal == "" {
		return "", invalidToken("no principal name in JWT claim: %s", o.PrincipalClaim)
	}
	exp, ok, err := numberClaim(claims, "exp")
	if err != nil {
		return "", invalidToken("%v", err)
	}
	if !ok {
		return "", invalidToken("no expiration time in JWT")
	}
	iat, hasIat, err := numberClaim(claims, "iat")
	if err != nil {
		return "", invalidToken("%v", err)
	}
	nowMs, skewMs := float64(now.UnixMilli()), float64(o.AllowableClockSkew.Milliseconds())
	if hasIat && 1000*iat > nowMs+skewMs {
		return "", invalidToken("the Issued At value (%v seconds) is after the current time plus the allowable clock skew (%v)", iat, o.AllowableClockSkew)
	}
	if nowMs-skewMs >= 1000*exp {
		return "", invalidToken("the token expired: the current time minus the allowable clock skew (%v) is on or after its Expiration Time (%v seconds)", o.AllowableClockSkew, exp)
	}
	if hasIat && exp <= iat {
		return "", invalidToken("the Expiration Time (%v seconds) is not after the Issued At time (%v seconds)", exp, iat)
	}
	scope, err := scopeClaim(claims, o.ScopeClaim)
	if err != nil {
		return "", invalidToken("%v", err)
	}
	for _, want := range o.RequiredScope {
		if !slices.Contains(scope, want) {
			return "", &oauthRefusal{status: "insufficient_scope", scope: strings.Join(o.RequiredScope, " "),
				reason: fmt.Sprintf("the token's scope %q lacks the required scope %q", scope, want)}
		}
	}
	return principal, nil
}

// jwtPart decodes one Base64URL part (padding optional) of a JWT as a JSON object.
func jwtPart(part string) (map[string]any, error) {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(part, "="))
	if err != nil {
		return nil, fmt.Errorf("malformed Base64URL value")
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var out map[string]any
	if err := d.Decode(&out); err != nil || out == nil {
		return nil, fmt.Errorf("not a JSON object")
	}
	return out, nil
}

// numberClaim reads claim name as a number of seconds; ok is false when it is absent.
func numberClaim(claims map[string]any, name string) (v float64, ok bool, err error) {
	switch c := claims[name].(type) {
	case nil:
		return 0, false, nil
	case json.Number:
		f, err := c.Float64()
		if err != nil || math.IsInf(f, 0) {
			return 0, false, fmt.Errorf("the %s claim %q is not a number", name, c)
		}
		return f, true, nil
	default:
		return 0, false, fmt.Errorf("the %s claim is not a number", name)
	}
}

// scopeClaim reads the scope claim as Kafka does: a string is one scope (trimmed;
// blank is none), a list holds one per element.
func scopeClaim(claims map[string]any, name string) ([]string, error) {
	switch c := claims[name].(type) {
	case nil:
		return nil, nil
	case string:
		if s := strings.TrimSpace(c); s != "" {
			return []string{s}, nil
		}
		return nil, nil
	case []any:
		var out []string
		for _, e := range c {
			s := strings.TrimSpace(fmt.Sprint(e))
			if s != "" {
				out = append(out, s)
			}
		}
		return out, nil
	default:
		return nil, fmt.Errorf("the %s claim is neither a string nor a list", name)
	}
}
