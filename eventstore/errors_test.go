package eventstore_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/eventstore"
	"github.com/streamd/streamd/internal/sqlerr"
)

// Each SQLSTATE of sql/functions/1000_eventstore.sql maps to its sentinel.
func TestSQLStateMapping(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]error{
		"SD401": eventstore.ErrVersionMismatch,
		"SD402": eventstore.ErrNotOpen,
		"SD403": eventstore.ErrSessionExpired,
		"SD404": eventstore.ErrSessionHeld,
		"SD405": eventstore.ErrNotVersioned,
		"SD406": eventstore.ErrUnknownEventType,
	} {
		err := sqlerr.Wrap(&pgconn.PgError{Code: code, Message: "m"})
		require.ErrorIs(t, err, want, code)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), code)
	}
}
