package retention

import (
	"errors"

	"github.com/streamd/streamd/internal/sqlerr"
)

// Conditions retention reports, matched with errors.Is. Errors raised by streamd's
// SQL also unwrap to the *pgconn.PgError, whose message names the bad value.
var (
	// ErrInvalidArgument: a negative or zero limit, batch size or offset.
	ErrInvalidArgument = sqlerr.ErrRetentionInvalidArgument
	// ErrNoPolicy: the stream has no retention policy.
	ErrNoPolicy = sqlerr.ErrNoRetentionPolicy
	// ErrBusy: another runner (another streamd instance) is applying retention to the
	// stream right now.
	ErrBusy = errors.New("retention already running for the stream")
)
