package kafka

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
)

// The server side of SCRAM (RFC 5802; SHA-256 and SHA-512 as RFC 7677), on the
// standard library. Not github.com/xdg-go/scram: it checks the client's final nonce
// for equality, as the RFC says, while Kafka checks only that it ends with the
// server's, and librdkafka (kcat, confluent-kafka) sends its own nonce in front of
// the server's, so it authenticates against Kafka but not against a strict server.
// Like Kafka, no SASLprep: usernames and passwords are their UTF-8 bytes.

// scramHash is one SCRAM mechanism's hash.
type scramHash struct {
	name string
	new  func() hash.Hash
}

var (
	scramSHA256 = scramHash{"SCRAM-SHA-256", sha256.New}
	scramSHA512 = scramHash{"SCRAM-SHA-512", sha512.New}
)

// scramCredential is what the server keeps of a password: RFC 5802's StoredKey and
// ServerKey under a salt and iteration count.
type scramCredential struct {
	salt      []byte
	iters     int
	storedKey []byte
	serverKey []byte
}

func (h scramHash) hmac(key []byte, msg string) []byte {
	m := hmac.New(h.new, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

func (h scramHash) sum(b []byte) []byte {
	d := h.new()
	d.Write(b)
	return d.Sum(nil)
}

// credential derives password's stored credential.
func (h scramHash) credential(password string, salt []byte, iters int) (scramCredential, error) {
	salted, err := pbkdf2.Key(h.new, password, salt, iters, h.new().Size())
	if err != nil {
		return scramCredential{}, err
	}
	clientKey := h.hmac(salted, "Client Key")
	return scramCredential{salt: salt, iters: iters, storedKey: h.sum(clientKey), serverKey: h.hmac(salted, "Server Key")}, nil
}

// errSCRAM: a SCRAM message that does not parse or a proof that does not match.
var errSCRAM = errors.New("scram")

// scramServer is one SCRAM exchange, server side: first takes the client-first
// message, final the client-final message.
type scramServer struct {
	hash scramHash
	// lookup returns the credentials of a username (one per token, all with the same
	// salt); none for an unknown user, which then gets a made-up salt so that the
	// exchange looks the same.
	lookup func(user string) []scramCredential
	// fakeSalt is the salt shown for an unknown user.
	fakeSalt func(user string) []byte
	// serverNonce is the server's part of the nonce (random; fixed in tests).
	serverNonce string

	user, authzID, gs2Header     string
	clientFirstBare, serverFirst string
	nonce                        string
	creds                        []scramCredential
}

func newServerNonce() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b) // no ',' and no '='
}

// first parses "gs2-header client-first-message-bare" and returns the server-first
// message.
func (s *scramServer) first(msg string) (string, error) {
	// gs2-header = cbind-flag "," [ "a=" saslname ] ","
	flag, rest, ok := strings.Cut(msg, ",")
	if !ok || (flag != "n" && flag != "y") {
		return "", fmt.Errorf("%w: client-first must start n, or y, (channel binding is not supported)", errSCRAM)
	}
	authz, bare, ok := strings.Cut(rest, ",")
	if !ok {
		return "", fmt.Errorf("%w: client-first has no gs2 header", errSCRAM)
	}
	if authz != "" {
		a, ok := strings.CutPrefix(authz, "a=")
		if !ok {
			return "", fmt.Errorf("%w: bad authorization id", errSCRAM)
		}
		if s.authzID, ok = decodeSASLName(a); !ok {
			return "", fmt.Errorf("%w: bad authorization id", errSCRAM)
		}
	}
	s.gs2Header = flag + "," + authz + ","
	attrs := strings.Split(bare, ",")
	if len(attrs) < 2 || !strings.HasPrefix(attrs[0], "n=") || !strings.HasPrefix(attrs[1], "r=") || len(attrs[1]) < 3 {
		return "", fmt.Errorf("%w: client-first-message-bare must be n=...,r=...", errSCRAM)
	}
	// Extensions (Kafka's tokenauth=...) may follow: delegation tokens are not served,
	// and the others change nothing here.
	if s.user, ok = decodeSASLName(attrs[0][2:]); !ok || s.user == "" {
		return "", fmt.Errorf("%w: bad username", errSCRAM)
	}
	s.clientFirstBare = bare
	s.creds = s.lookup(s.user)
	salt, iters := s.fakeSalt(s.user), scramIterations
	if len(s.creds) > 0 {
		salt, iters = s.creds[0].salt, s.creds[0].iters
	}
	s.nonce = attrs[1][2:] + s.serverNonce
	s.serverFirst = "r=" + s.nonce + ",s=" + base64.StdEncoding.EncodeToString(salt) + ",i=" + strconv.Itoa(iters)
	return s.serverFirst, nil
}

// final checks the client-final message's proof against each credential of the user
// and returns the server-final message.
func (s *scramServer) final(msg string) (string, error) {
	i := strings.LastIndex(msg, ",p=")
	if i < 0 {
		return "", fmt.Errorf("%w: client-final has no proof", errSCRAM)
	}
	withoutProof := msg[:i]
	proof, err := base64.StdEncoding.DecodeString(msg[i+3:])
	if err != nil {
		return "", fmt.Errorf("%w: client-final proof is not base64", errSCRAM)
	}
	var cbind, nonce string
	for _, a := range strings.Split(withoutProof, ",") {
		switch {
		case strings.HasPrefix(a, "c="):
			cbind = a[2:]
		case strings.HasPrefix(a, "r="):
			nonce = a[2:]
		}
	}
	if cbind != base64.StdEncoding.EncodeToString([]byte(s.gs2Header)) {
		return "", fmt.Errorf("%w: client-final channel binding does not match the gs2 header", errSCRAM)
	}
	// Kafka's check (see the top of the file): the nonce ends with the server's.
	if !strings.HasSuffix(nonce, s.nonce) {
		return "", fmt.Errorf("%w: client-final nonce is not the server's", errSCRAM)
	}
	authMessage := s.clientFirstBare + "," + s.serverFirst + "," + withoutProof
	for _, c := range s.creds {
		sig := s.hash.hmac(c.storedKey, authMessage)
		if len(proof) != len(sig) {
			break
		}
		clientKey := make([]byte, len(sig))
		subtle.XORBytes(clientKey, proof, sig)
		if subtle.ConstantTimeCompare(s.hash.sum(clientKey), c.storedKey) == 1 {
			return "v=" + base64.StdEncoding.EncodeToString(s.hash.hmac(c.serverKey, authMessage)), nil
		}
	}
	return "", fmt.Errorf("%w: invalid proof", errSCRAM)
}

// decodeSASLName undoes RFC 5802's saslname escaping: "=2C" is ',' and "=3D" is '='.
func decodeSASLName(s string) (string, bool) {
	if !strings.Contains(s, "=") {
		return s, true
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '=' {
			b.WriteByte(s[i])
			continue
		}
		switch {
		case strings.HasPrefix(s[i:], "=2C"):
			b.WriteByte(',')
		case strings.HasPrefix(s[i:], "=3D"):
			b.WriteByte('=')
		default:
			return "", false
		}
		i += 2
	}
	return b.String(), true
}
