package streams_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// TestSQLStateMapping: each SQLSTATE the log's SQL raises maps to its sentinel, keeps
// PostgreSQL's message, and still unwraps to the *pgconn.PgError.
func TestSQLStateMapping(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]error{
		"SD001": streams.ErrStreamNotFound,
		"SD002": streams.ErrPartitionNotFound,
		"SD003": streams.ErrInvalidName,
		"SD004": streams.ErrPayloadTooLarge,
		"SD005": streams.ErrInvalidArgument,
		"SD006": streams.ErrPartitionsDecrease,
		"SD007": streams.ErrOffsetOutOfRange,
		"SD008": streams.ErrOutOfOrderSequence,
		"SD009": streams.ErrProducerFenced,
		"SD010": streams.ErrDuplicateSequence,
		"22P02": streams.ErrInvalidJSON,
	} {
		pgErr := &pgconn.PgError{Code: code, Message: "what was wrong"}
		err := sqlerr.Wrap(pgErr)
		require.ErrorIs(t, err, want, code)
		require.Contains(t, err.Error(), "what was wrong")
		var back *pgconn.PgError
		require.True(t, errors.As(err, &back))
		require.Equal(t, code, back.Code)
	}
	other := &pgconn.PgError{Code: "23505"}
	require.Same(t, other, sqlerr.Wrap(other).(*pgconn.PgError), "unregistered codes pass through")
	require.NoError(t, sqlerr.Wrap(nil))
}
