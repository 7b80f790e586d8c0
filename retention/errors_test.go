package retention_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/retention"
	"github.com/streamd/streamd/streamconfig"
)

// Each SQLSTATE of retention and configuration maps to its sentinel, keeps
// PostgreSQL's message and unwraps to the *pgconn.PgError.
func TestSQLStateMapping(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]error{
		sqlerr.InvalidStreamConfig:      streamconfig.ErrInvalidConfig,
		sqlerr.RetentionInvalidArgument: retention.ErrInvalidArgument,
		sqlerr.RetentionPolicyNotFound:  retention.ErrNoPolicy,
	} {
		err := sqlerr.Wrap(&pgconn.PgError{Code: code, Message: "what was wrong"})
		require.ErrorIs(t, err, want, code)
		require.Contains(t, err.Error(), "what was wrong")
		var back *pgconn.PgError
		require.True(t, errors.As(err, &back))
		require.Equal(t, code, back.Code)
	}
}
