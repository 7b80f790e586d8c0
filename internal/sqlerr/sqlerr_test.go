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

	"github.com/streamd/streamd/consumergroup"
	"github.com/streamd/streamd/eventstore"
	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/messages"
	"github.com/streamd/streamd/retention"
	"github.com/streamd/streamd/streamconfig"
	"github.com/streamd/streamd/streams"
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

// TestEveryCodeMapsToItsSentinel is the table test of the one SQLSTATE map: every
// code streamd's SQL raises becomes the sentinel its public package exports, keeps
// PostgreSQL's message and unwraps to the *pgconn.PgError; other codes pass through.
func TestEveryCodeMapsToItsSentinel(t *testing.T) {
	t.Parallel()
	want := map[string]error{
		sqlerr.StreamNotFound:        streams.ErrStreamNotFound,
		sqlerr.PartitionNotFound:     streams.ErrPartitionNotFound,
		sqlerr.InvalidName:           streams.ErrInvalidName,
		sqlerr.PayloadTooLarge:       streams.ErrPayloadTooLarge,
		sqlerr.InvalidArgument:       streams.ErrInvalidArgument,
		sqlerr.PartitionDecrease:     streams.ErrPartitionsDecrease,
		sqlerr.OffsetOutOfRange:      streams.ErrOffsetOutOfRange,
		sqlerr.OutOfOrderSequence:    streams.ErrOutOfOrderSequence,
		sqlerr.ProducerFenced:        streams.ErrProducerFenced,
		sqlerr.DuplicateSequence:     streams.ErrDuplicateSequence,
		sqlerr.InvalidJSON:           streams.ErrInvalidJSON,
		sqlerr.InvalidEncoding:       consumergroup.ErrInvalidArgument,
		sqlerr.JSONUnsupportedEscape: streams.ErrInvalidJSON,
		sqlerr.ProgramLimitExceeded:  streams.ErrInvalidArgument,

		sqlerr.Fenced:             consumergroup.ErrFenced,
		sqlerr.FencedSession:      consumergroup.ErrFenced,
		sqlerr.FencedPartition:    consumergroup.ErrFenced,
		sqlerr.FencedEpoch:        consumergroup.ErrFenced,
		sqlerr.GroupNotFound:      consumergroup.ErrGroupNotFound,
		sqlerr.InvalidGroupID:     consumergroup.ErrInvalidGroupID,
		sqlerr.GroupNotEmpty:      consumergroup.ErrGroupNotEmpty,
		sqlerr.GroupInvalidArg:    consumergroup.ErrInvalidArgument,
		sqlerr.DeadLetterNotFound: consumergroup.ErrDeadLetterNotFound,
		sqlerr.AlreadyCommitted:   consumergroup.ErrAlreadyCommitted,

		sqlerr.UnknownMember:            consumergroup.ErrUnknownMember,
		sqlerr.InconsistentProtocol:     consumergroup.ErrInconsistentGroupProtocol,
		sqlerr.FencedInstance:           consumergroup.ErrInstanceFenced,
		sqlerr.IllegalGeneration:        consumergroup.ErrIllegalGeneration,
		sqlerr.ClassicRebalanceUnderway: consumergroup.ErrRebalanceInProgress,

		sqlerr.QueueNotFound:        messages.ErrQueueNotFound,
		sqlerr.InvalidQueueName:     messages.ErrInvalidName,
		sqlerr.QueuePayloadTooLarge: messages.ErrPayloadTooLarge,
		sqlerr.QueueInvalidArgument: messages.ErrInvalidArgument,
		sqlerr.QueueInUse:           messages.ErrQueueInUse,

		sqlerr.InvalidStreamConfig:      streamconfig.ErrInvalidConfig,
		sqlerr.RetentionInvalidArgument: retention.ErrInvalidArgument,
		sqlerr.RetentionPolicyNotFound:  retention.ErrNoPolicy,

		sqlerr.VersionMismatch:  eventstore.ErrVersionMismatch,
		sqlerr.SessionNotOpen:   eventstore.ErrNotOpen,
		sqlerr.SessionExpired:   eventstore.ErrSessionExpired,
		sqlerr.SessionHeld:      eventstore.ErrSessionHeld,
		sqlerr.NotVersioned:     eventstore.ErrNotVersioned,
		sqlerr.UnknownEventType: eventstore.ErrUnknownEventType,
	}
	require.Len(t, sqlerr.Codes(), len(want), "a code of the table is missing here, or one here from the table")
	for code, sentinel := range want {
		err := sqlerr.Wrap(fmt.Errorf("x: %w", &pgconn.PgError{Code: code, Message: "what was wrong"}))
		require.ErrorIs(t, err, sentinel, code)
		require.Contains(t, err.Error(), "what was wrong", code)
		var back *pgconn.PgError
		require.True(t, errors.As(err, &back), code)
		require.Equal(t, code, back.Code)
	}
	// Text PostgreSQL cannot store (a NUL byte in a group id, a filter, an id) is
	// every package's invalid argument, not an untyped error (a 500 at the API).
	text := sqlerr.Wrap(&pgconn.PgError{Code: sqlerr.InvalidEncoding, Message: "invalid byte sequence"})
	for _, sentinel := range []error{streams.ErrInvalidArgument, consumergroup.ErrInvalidArgument,
		messages.ErrInvalidArgument, retention.ErrInvalidArgument} {
		require.ErrorIs(t, text, sentinel)
	}
	require.NotErrorIs(t, text, streams.ErrInvalidJSON)
	// So is a value over PostgreSQL's size limit for it (an index row's: a long key of
	// a versioned stream).
	big := sqlerr.Wrap(&pgconn.PgError{Code: sqlerr.ProgramLimitExceeded, Message: "index row size 8040 exceeds"})
	for _, sentinel := range []error{streams.ErrInvalidArgument, consumergroup.ErrInvalidArgument,
		messages.ErrInvalidArgument, retention.ErrInvalidArgument} {
		require.ErrorIs(t, big, sentinel)
	}
	require.NotErrorIs(t, big, sqlerr.ErrInvalidText)
	other := &pgconn.PgError{Code: "23505"}
	require.Same(t, other, sqlerr.Wrap(other), "a code outside the table passes through")
}
