package sqlerr_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
)

func TestRetriable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&pgconn.PgError{Code: "40001"}, true},
		{&pgconn.PgError{Code: "40P01"}, true},
		{&pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}, true},
		{&pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}, true},
		{&pgconn.PgError{Code: "57014", Message: "canceling statement due to user request"}, false},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "53300"}, true},
		{&pgconn.PgError{Code: "23505"}, false},
		{&pgconn.PgError{Code: "SD001"}, false},
		{&pgconn.PgError{Code: "22P02"}, false},
		{fmt.Errorf("wrapped: %w", io.ErrUnexpectedEOF), true},
		{&net.OpError{Op: "dial", Err: errors.New("refused")}, true},
		{context.Canceled, false},
		{errors.New("some logic error"), false},
	} {
		require.Equal(t, tc.want, sqlerr.Retriable(tc.err), "%v", tc.err)
	}
}

func TestRegisterTwiceWithAnotherSentinelPanics(t *testing.T) {
	t.Parallel()
	a, b := errors.New("a"), errors.New("b")
	sqlerr.Register("ZZ998", a)
	sqlerr.Register("ZZ998", a) // the same pair again is fine
	require.Panics(t, func() { sqlerr.Register("ZZ998", b) })
}
