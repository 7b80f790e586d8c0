package kafka

import (
	"crypto/sha1"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// vectorServer is a scramServer with the salt and server nonce of a published
// example, for user "user" with password "pencil" (and a second, wrong credential
// first, as a principal with two tokens has).
func vectorServer(t *testing.T, h scramHash, saltB64, serverNonce string) *scramServer {
	t.Helper()
	salt, err := base64.StdEncoding.DecodeString(saltB64)
	require.NoError(t, err)
	other, err := h.credential("not-pencil", salt, 4096)
	require.NoError(t, err)
	good, err := h.credential("pencil", salt, 4096)
	require.NoError(t, err)
	return &scramServer{hash: h, serverNonce: serverNonce,
		lookup: func(user string) []scramCredential {
			if user == "user" {
				return []scramCredential{other, good}
			}
			return nil
		},
		fakeSalt: func(string) []byte { return salt }}
}

// The server side answers the examples of RFC 5802 (SHA-1, section 5) and RFC 7677
// (SHA-256, section 3) byte for byte.
func TestSCRAMRFCVectors(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		hash                                               scramHash
		salt, serverNonce                                  string
		clientFirst, serverFirst, clientFinal, serverFinal string
	}{
		{scramHash{"SCRAM-SHA-1", sha1.New}, "QSXCR+Q6sek8bf92", "3rfcNHYJY1ZVvWVs7j",
			"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
			"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096",
			"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
			"v=rmF9pqV8S7suAoZWja4dJRkFsKQ="},
		{scramSHA256, "W22ZaJ0SNY7soEsUEjb6gQ==", "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
			"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
			"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
			"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
			"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="},
	} {
		s := vectorServer(t, v.hash, v.salt, v.serverNonce)
		first, err := s.first(v.clientFirst)
		require.NoError(t, err, v.hash.name)
		require.Equal(t, v.serverFirst, first, v.hash.name)
		final, err := s.final(v.clientFinal)
		require.NoError(t, err, v.hash.name)
		require.Equal(t, v.serverFinal, final, v.hash.name)
		require.Equal(t, "user", s.user)

		// A proof one bit off, a nonce that is not the server's, a channel binding
		// that is not the header's: refused.
		for _, bad := range []string{
			v.clientFinal[:len(v.clientFinal)-5] + "A" + v.clientFinal[len(v.clientFinal)-4:],
			"c=biws,r=someone-elses-nonce,p=" + v.clientFinal[strings.LastIndex(v.clientFinal, ",p=")+3:],
			"c=eSws" + v.clientFinal[len("c=biws"):],
		} {
			s := vectorServer(t, v.hash, v.salt, v.serverNonce)
			_, err := s.first(v.clientFirst)
			require.NoError(t, err)
			_, err = s.final(bad)
			require.ErrorIs(t, err, errSCRAM, "%s: %q", v.hash.name, bad)
		}
	}

	// An unknown user gets a server-first like anyone's, and then a refusal.
	s := vectorServer(t, scramSHA256, "W22ZaJ0SNY7soEsUEjb6gQ==", "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
	first, err := s.first("n,,n=stranger,r=rOprNGfwEbeRWgbNEkqO")
	require.NoError(t, err)
	require.Equal(t, "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", first)
	_, err = s.final("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
	require.ErrorIs(t, err, errSCRAM)

	// Malformed client-first messages.
	for _, bad := range []string{"", "p=tls-unique,,n=user,r=x", "n,,r=x,n=user", "n,,n=,r=x", "n,,n=us=er,r=x", "n,x,n=user,r=x"} {
		_, err := vectorServer(t, scramSHA256, "W22ZaJ0SNY7soEsUEjb6gQ==", "x").first(bad)
		require.ErrorIs(t, err, errSCRAM, "%q", bad)
	}
	name, ok := decodeSASLName("a=2Cb=3Dc")
	require.True(t, ok)
	require.Equal(t, "a,b=c", name)
}
