package streams

import (
	"errors"
	"fmt"

	"github.com/streamd/streamd/internal/sqlerr"
)

// Conditions the log reports. Each is matched with errors.Is; the error's text says
// which stream, partition or value was wrong. Errors raised by streamd's SQL also
// unwrap to the *pgconn.PgError PostgreSQL returned.
var (
	// ErrStreamNotFound: the stream does not exist.
	ErrStreamNotFound = sqlerr.ErrStreamNotFound
	// ErrPartitionNotFound: the stream has no such partition (negative or too high).
	ErrPartitionNotFound = sqlerr.ErrPartitionNotFound
	// ErrInvalidName: a stream name that is not 1 to 249 characters of [A-Za-z0-9._-].
	ErrInvalidName = sqlerr.ErrInvalidName
	// ErrPayloadTooLarge: a payload over the stream's max_payload_bytes.
	ErrPayloadTooLarge = sqlerr.ErrPayloadTooLarge
	// ErrInvalidJSON: Data that is not valid JSON.
	ErrInvalidJSON = sqlerr.ErrInvalidJSON
	// ErrInvalidArgument: any other bad input (negative offset, both payload kinds, ...).
	ErrInvalidArgument = sqlerr.ErrInvalidArgument
	// ErrPartitionsDecrease: CreateStream asked for fewer partitions than the stream has.
	ErrPartitionsDecrease = sqlerr.ErrPartitionsDecrease
	// ErrOffsetOutOfRange: a fetch below the log start (deleted by retention) or past
	// the log end. The error is an *OffsetOutOfRangeError with the valid range.
	ErrOffsetOutOfRange = sqlerr.ErrOffsetOutOfRange
	// ErrProducerClosed: Produce after Close.
	ErrProducerClosed = errors.New("producer closed")
)

// OffsetOutOfRangeError says which offsets a partition holds when a fetch asked for
// one outside them. It matches ErrOffsetOutOfRange.
type OffsetOutOfRangeError struct {
	Stream         string
	Partition      int32
	Offset         int64
	LogStartOffset int64 // the lowest offset still stored
	NextOffset     int64 // the log end: the offset the next event will get
}

func (e *OffsetOutOfRangeError) Error() string {
	return fmt.Sprintf("offset %d out of range for %s/%d: it holds [%d, %d)",
		e.Offset, e.Stream, e.Partition, e.LogStartOffset, e.NextOffset)
}

// Is makes errors.Is(err, ErrOffsetOutOfRange) true.
func (e *OffsetOutOfRangeError) Is(target error) bool { return target == ErrOffsetOutOfRange }

func invalid(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
