package eventstore

import (
	"errors"

	"github.com/streamd/streamd/internal/sqlerr"
)

// Conditions the event store reports, matched with errors.Is. Errors raised by SQL
// also unwrap to the *pgconn.PgError, whose message names the stream, key and
// versions involved. Bad input in general (an empty key, a negative expected version)
// is streams.ErrInvalidArgument, as everywhere in streamd.
var (
	// ErrVersionMismatch: the key was not at the expected version; another writer got
	// there first. Nothing was written.
	ErrVersionMismatch = sqlerr.ErrVersionMismatch
	// ErrNotOpen: the session does not hold the key, and no other live session does:
	// it was never opened, was closed or released, the session that took it over
	// after it expired has closed or expired since, or an append outside any session
	// wrote the key after it expired (which ends the expired hold).
	ErrNotOpen = sqlerr.ErrSessionNotOpen
	// ErrSessionExpired: the session holds the key but its timeout has passed (Renew
	// revives it).
	ErrSessionExpired = sqlerr.ErrSessionExpired
	// ErrSessionHeld: another live session holds the key. For an append outside any
	// session, or Open; for a session, it means another session took the key over
	// after this one expired.
	ErrSessionHeld = sqlerr.ErrSessionHeld
	// ErrOpenTimeout: Open could not take the key within its open timeout, because
	// another session held it all along or an append in flight (AppendTx in an open
	// transaction) kept the key locked.
	ErrOpenTimeout = errors.New("open timed out")
	// ErrNotVersioned: the stream does not keep key versions (see ConfigureStream).
	ErrNotVersioned = sqlerr.ErrNotVersioned
	// ErrSnapshotNotFound: SnapshotAt found no snapshot of the key at that version.
	ErrSnapshotNotFound = errors.New("snapshot not found")
	// ErrUnknownEventType: the stream accepts registered event types only, and this
	// one is not registered.
	ErrUnknownEventType = sqlerr.ErrUnknownEventType
	// ErrSessionClosed: an operation on a Session after Close.
	ErrSessionClosed = errors.New("session closed")
)
