package pgtext_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/pgtext"
)

func TestProblems(t *testing.T) {
	t.Parallel()
	require.Empty(t, pgtext.JSONProblem([]byte(`{"a":"b\\u0000"}`)), "an escaped backslash, then u0000: fine")
	require.Empty(t, pgtext.JSONProblem([]byte(`{"a":"\u00e9"}`)))
	require.NotEmpty(t, pgtext.JSONProblem([]byte(`{"a":"\u0000"}`)))
	require.NotEmpty(t, pgtext.JSONProblem([]byte(`{"a":"\\\u0000"}`)))
	require.NotEmpty(t, pgtext.JSONProblem([]byte("{\"a\":\"\xff\"}")))
	// UTF-16 surrogate escapes: jsonb takes a high one followed at once by a low one.
	require.Empty(t, pgtext.JSONProblem([]byte(`["\ud83d\ude00", "\uD83D\uDE00", "\\ud800"]`)))
	require.NotEmpty(t, pgtext.JSONProblem([]byte(`"\ud800"`)))
	require.NotEmpty(t, pgtext.JSONProblem([]byte(`"\udc00"`)))
	require.NotEmpty(t, pgtext.JSONProblem([]byte(`"\ud800\u0041"`)))
	require.NotEmpty(t, pgtext.JSONProblem([]byte(`"\ud800\ud800\udc00"`)))
	require.NotEmpty(t, pgtext.JSONProblem([]byte(`"\udc00\ud800"`)))
	// Numbers: what numeric_in takes (a scale of at most 16383, a weight within int16).
	for _, n := range []string{`1e131071`, `-9.9e131071`, `1e-16383`, `0e-16383`, `0e99999`, `0.000e16000`, `"1e999999"`,
		`0.` + strings.Repeat("0", 16382) + `1`, `0.` + strings.Repeat("1", 6383) + `e-9999`} {
		require.Empty(t, pgtext.JSONProblem([]byte(n)), n[:min(len(n), 20)])
	}
	for _, n := range []string{`1e131072`, `[1E+131072]`, `{"a":1e-16384}`, `0e-16384`, `0e1073741823`, `1e99999999999999999999`,
		`0.` + strings.Repeat("0", 16383) + `1`, `0.` + strings.Repeat("1", 6385) + `e-9999`} {
		require.NotEmpty(t, pgtext.JSONProblem([]byte(n)), n[:min(len(n), 20)])
	}
	require.Equal(t, "a \uFFFD b \uFFFD é", pgtext.Clean("a \x00 b \xff\xfe é"))
	require.Equal(t, "key é", pgtext.Clean("key é"))
	require.Empty(t, pgtext.TextProblem("key é"))
	require.NotEmpty(t, pgtext.TextProblem("a\x00b"))
	require.NotEmpty(t, pgtext.TextProblem("\xff"))
}
