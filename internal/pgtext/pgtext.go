// Package pgtext checks text and JSON for what PostgreSQL refuses although Go accepts
// it, so that bad input gets a typed error before anything is sent: json.Valid
// accepts invalid UTF-8 inside strings, the escape \u0000, UTF-16 surrogate escapes
// that make no pair, and numbers of any size, and a Go string may hold NUL bytes;
// PostgreSQL's text and jsonb refuse all of them (SQLSTATEs 22021, 22P05, 22P02,
// 22003).
package pgtext

import (
	"bytes"
	"strconv"
	"strings"
	"unicode/utf8"
)

// JSONProblem returns why PostgreSQL's jsonb would refuse b, which json.Valid
// accepted, or "" when it would not.
func JSONProblem(b []byte) string {
	if !utf8.Valid(b) {
		return "it is not valid UTF-8"
	}
	if bytes.Contains(b, []byte(`\u`)) {
		if why := escapeProblem(b); why != "" {
			return why
		}
	}
	if mayOverflowNumeric(b) {
		return numberProblem(b)
	}
	return ""
}

// escapeProblem returns why jsonb refuses a \u escape of b (valid JSON): \u0000,
// or a UTF-16 surrogate escape that is not a high one followed at once by a low one.
func escapeProblem(b []byte) string {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 >= len(b) {
			continue
		}
		if b[i+1] != 'u' || i+6 > len(b) {
			i++ // skip the escaped character
			continue
		}
		switch r := hex4(b[i+2 : i+6]); {
		case r == 0:
			return `it holds \u0000, which PostgreSQL's jsonb cannot store`
		case r >= 0xd800 && r <= 0xdbff:
			if i+12 <= len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
				if lo := hex4(b[i+8 : i+12]); lo >= 0xdc00 && lo <= 0xdfff {
					i += 11 // the pair
					continue
				}
			}
			return "it holds a UTF-16 high surrogate escape without its low one, which PostgreSQL's jsonb refuses"
		case r >= 0xdc00 && r <= 0xdfff:
			return "it holds a UTF-16 low surrogate escape without its high one, which PostgreSQL's jsonb refuses"
		}
		i += 5
	}
	return ""
}

// hex4 is the value of four hex digits (json.Valid checked them).
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// PostgreSQL's numeric (jsonb's numbers, numeric_in): a scale (digits after the
// point, less the exponent) of at most maxDscale, a weight (of the first non-zero
// base-10000 digit) within int16, an exponent under maxExponent in size.
const (
	maxDscale   = 0x3fff            // NUMERIC_DSCALE_MAX
	maxWeight   = 32767             // int16
	minWeight   = -32768            // int16
	maxExponent = 2147483647 / 2    // INT_MAX / 2 (set_var_from_str)
	numberRunes = "+-.0123456789eE" // what a JSON number is made of
)

var pow10 = [...]int{1, 10, 100, 1000, 10000}

// mayOverflowNumeric reports whether b may hold a number that numeric_in refuses: a
// run of more than maxDscale digits, or an exponent of d digits after a run of r
// digits and points with d >= 5 or r + 10^d over maxDscale (a superset, strings
// included: numberProblem then walks the numbers). Cheap where it says no, which is
// nearly always: bytes.IndexByte for the exponents, and a probe every digitProbe
// bytes for the runs (a run over maxDscale holds one), where a walk of every byte
// cost a 36 KB payload as much as json.Valid.
func mayOverflowNumeric(b []byte) bool {
	for p := digitProbe - 1; p < len(b); p += digitProbe {
		if !isDigit(b[p]) {
			continue
		}
		l, r := p, p+1
		for l > 0 && isDigit(b[l-1]) {
			l--
		}
		for r < len(b) && isDigit(b[r]) {
			r++
		}
		if r-l > maxDscale {
			return true
		}
	}
	for _, e := range [...]byte{'e', 'E'} {
		for i := 0; ; {
			k := bytes.IndexByte(b[i:], e)
			if k < 0 {
				break
			}
			at := i + k
			i = at + 1
			l := at // the run of digits and points before the exponent
			for l > 0 && (isDigit(b[l-1]) || b[l-1] == '.') && at-l <= maxDscale {
				l--
			}
			if l == at {
				continue // a number's exponent follows a digit
			}
			j := i
			if j < len(b) && (b[j] == '+' || b[j] == '-') {
				j++
			}
			i = j
			for i < len(b) && isDigit(b[i]) {
				i++
			}
			if d := i - j; d >= 5 || (d > 0 && at-l+pow10[d] > maxDscale) {
				return true
			}
		}
	}
	return false
}

// digitProbe is the stride of mayOverflowNumeric's probes for long runs of digits:
// a run of more than maxDscale digits covers at least one probe.
const digitProbe = (maxDscale + 1) / 2

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// numberProblem returns why jsonb refuses a number of b (valid JSON), or "".
func numberProblem(b []byte) string {
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			if c == '\\' {
				i++
			} else if c == '"' {
				inString = false
			}
			continue
		}
		if c == '"' {
			inString = true
			continue
		}
		if c != '-' && (c < '0' || c > '9') {
			continue
		}
		j := i
		for j < len(b) && strings.IndexByte(numberRunes, b[j]) >= 0 {
			j++
		}
		if !numericFits(b[i:j]) {
			return "it holds a number out of the range of PostgreSQL's numeric: " + abbreviate(b[i:j])
		}
		i = j - 1
	}
	return ""
}

// numericFits reports whether numeric_in takes the JSON number n without "value
// overflows numeric format".
func numericFits(n []byte) bool {
	if n[0] == '-' {
		n = n[1:]
	}
	mant, exp := n, []byte(nil)
	if i := bytes.IndexAny(n, "eE"); i >= 0 {
		mant, exp = n[:i], n[i+1:]
	}
	intPart, frac, _ := bytes.Cut(mant, []byte("."))
	var e int64
	if len(exp) > 0 {
		neg := exp[0] == '-'
		if exp[0] == '+' || exp[0] == '-' {
			exp = exp[1:]
		}
		exp = bytes.TrimLeft(exp, "0")
		if len(exp) > 10 {
			return false
		}
		for _, c := range exp {
			e = e*10 + int64(c-'0')
		}
		if e >= maxExponent {
			return false
		}
		if neg {
			e = -e
		}
	}
	if int64(len(frac))-e > maxDscale {
		return false
	}
	// The decimal weight of the first non-zero digit (10^w); none: zero fits.
	digits := append(append([]byte{}, intPart...), frac...)
	k := bytes.IndexFunc(digits, func(r rune) bool { return r != '0' })
	if k < 0 {
		return true
	}
	w := int64(len(intPart)) - 1 - int64(k) + e
	var weight int64 // of its base-10000 digit
	if w >= 0 {
		weight = w / 4
	} else {
		weight = -((-w-1)/4 + 1)
	}
	return weight >= minWeight && weight <= maxWeight
}

// abbreviate returns n, or its start and length when it is long.
func abbreviate(n []byte) string {
	if len(n) <= 40 {
		return string(n)
	}
	return string(n[:20]) + "... (" + strconv.Itoa(len(n)) + " characters)"
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

// Clean returns s as PostgreSQL's text takes it: invalid UTF-8 and NUL bytes become
// U+FFFD. For text a caller does not choose (an error's message), where refusing it
// would lose what it says.
func Clean(s string) string {
	if TextProblem(s) == "" {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
