package retention

import (
	"errors"

	"github.com/streamd/streamd/internal/sqlerr"
)

// Conditions retention reports, matched with errors.Is. Errors raised by streamd's
// SQL also unwrap to the *pgconn.PgError, whose message names the bad value.
var (
	// ErrInvalidArgument: a negative or zero limit, batch size or offset.
	ErrInvalidArgument = errors.New("invalid retention argument")
	// ErrNoPolicy: the stream has no retention policy.
	ErrNoPolicy = errors.New("no retention policy")
	// ErrBusy: another runner (another streamd instance) is applying retention to the
	// stream right now.
	ErrBusy = errors.New("retention already running for the stream")
)

func init() {
	sqlerr.Register(sqlerr.RetentionInvalidArgument, ErrInvalidArgument)
	sqlerr.Register(sqlerr.RetentionPolicyNotFound, ErrNoPolicy)
}
