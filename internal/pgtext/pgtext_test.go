package pgtext_test

import (
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
	require.Empty(t, pgtext.TextProblem("key é"))
	require.NotEmpty(t, pgtext.TextProblem("a\x00b"))
	require.NotEmpty(t, pgtext.TextProblem("\xff"))
}
