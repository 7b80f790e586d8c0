// Package pgtext checks text and JSON for what PostgreSQL refuses although Go accepts
// it, so that bad input gets a typed error before anything is sent: json.Valid
// accepts invalid UTF-8 inside strings and the escape \u0000, and a Go string may hold
// NUL bytes; PostgreSQL's text and jsonb refuse all three (SQLSTATEs 22021, 22P05).
package pgtext

import (
	"bytes"
	"strings"
	"unicode/utf8"
)

// JSONProblem returns why PostgreSQL's jsonb would refuse b, which json.Valid
// accepted, or "" when it would not.
func JSONProblem(b []byte) string {
	if !utf8.Valid(b) {
		return "it is not valid UTF-8"
	}
	if bytes.Contains(b, []byte(`\u0000`)) && hasNULEscape(b) {
		return `it holds \u0000, which PostgreSQL's jsonb cannot store`
	}
	return ""
}

// hasNULEscape reports whether b (valid JSON) holds the escape \u0000 (an escaped
// backslash followed by u0000 is not one).
func hasNULEscape(b []byte) bool {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 >= len(b) {
			continue
		}
		if b[i+1] == 'u' && i+5 < len(b) && string(b[i+2:i+6]) == "0000" {
			return true
		}
		i++ // skip the escaped character
	}
	return false
}

// TextProblem returns why PostgreSQL's text would refuse s, or "" when it would not.
func TextProblem(s string) string {
	if !utf8.ValidString(s) {
		return "it is not valid UTF-8"
	}
	if strings.IndexByte(s, 0) >= 0 {
		return "it holds a NUL byte"
	}
	return ""
}
