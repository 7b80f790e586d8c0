package messages

import (
	"errors"
	"fmt"

	"github.com/streamd/streamd/internal/sqlerr"
)

// Conditions the queue reports. Each is matched with errors.Is; the error's text says
// which queue, message or value was wrong. Errors raised by streamd's SQL also unwrap
// to the *pgconn.PgError PostgreSQL returned.
var (
	// ErrQueueNotFound: the queue (or a named dead-letter queue) does not exist.
	ErrQueueNotFound = sqlerr.ErrQueueNotFound
	// ErrInvalidName: a queue name that is not 1 to 249 characters of [A-Za-z0-9._-].
	ErrInvalidName = sqlerr.ErrInvalidQueueName
	// ErrPayloadTooLarge: a message whose data and headers exceed the queue's
	// MaxPayloadBytes.
	ErrPayloadTooLarge = sqlerr.ErrQueuePayloadTooLarge
	// ErrInvalidJSON: message data that is not valid JSON.
	ErrInvalidJSON = errors.New("invalid JSON")
	// ErrInvalidArgument: any other bad input (negative delay or timeout, a FIFO
	// message without a group key, a group key on a standard queue, ...).
	ErrInvalidArgument = sqlerr.ErrQueueInvalidArgument
	// ErrQueueInUse: DeleteQueue of a queue that another queue uses as its
	// dead-letter queue.
	ErrQueueInUse = sqlerr.ErrQueueInUse
	// ErrLeaseLost: a settlement (Ack, Nack, Extend, Term) whose receipt is stale: the
	// message was received again since, settled already, purged or moved. Nothing
	// changed. The error is a *LeaseLostError when it names the receipts.
	ErrLeaseLost = errors.New("lease lost")
)

// LeaseLostError lists the receipts of a batch settlement that no longer held their
// lease; the others were settled. It matches ErrLeaseLost.
type LeaseLostError struct {
	Queue    string
	Receipts []Receipt
}

func (e *LeaseLostError) Error() string {
	if len(e.Receipts) == 1 {
		r := e.Receipts[0]
		return fmt.Sprintf("lease lost: queue %s message %s (offset %d) was received again, settled or moved since", e.Queue, r.MessageID, r.Offset)
	}
	return fmt.Sprintf("lease lost: queue %s: %d receipts were received again, settled or moved since", e.Queue, len(e.Receipts))
}

// Is makes errors.Is(err, ErrLeaseLost) true.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

func invalid(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
