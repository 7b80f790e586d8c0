package consumergroup

import (
	"errors"

	"github.com/streamd/streamd/internal/sqlerr"
)

// Conditions the consumer group reports. Each is matched with errors.Is; the error's
// text says which group, member, partition or value was wrong. Errors raised by
// streamd's SQL also unwrap to the *pgconn.PgError PostgreSQL returned.
var (
	// ErrFenced: the member is not a live member of the group at its epoch (its session
	// expired, it left, or a restart with its instance id replaced it), or it does not
	// own the partition it commits. Nothing was written. The Consumer reacts by
	// dropping its partitions (OnLost) and joining again, unless another live member
	// now holds its InstanceID: then Run returns ErrInstanceFenced.
	ErrFenced = sqlerr.ErrFenced
	// ErrInstanceFenced: Run returns it (wrapping the ErrFenced that ended the session)
	// when this static member was fenced because another member joined with the same
	// Config.InstanceID and holds it with a live session: two processes configured with
	// one instance id, or a restart while the old process still ran. As with Kafka's
	// FENCED_INSTANCE_ID, the older member stops (after OnLost) instead of joining again,
	// which would take the partitions back and fence the other, forever, both handling
	// them meanwhile. A restart after the old process died is not affected: it joins
	// and takes over the instance.
	ErrInstanceFenced = errors.New("instance id taken over by another member")
	// ErrGroupNotFound: the group does not exist.
	ErrGroupNotFound = sqlerr.ErrGroupNotFound
	// ErrInvalidGroupID: a group id that is not 1 to 249 characters of [A-Za-z0-9._:-].
	ErrInvalidGroupID = sqlerr.ErrInvalidGroupID
	// ErrGroupNotEmpty: an admin operation (offset reset, delete) refused because the
	// group has live members; stop them or force it.
	ErrGroupNotEmpty = sqlerr.ErrGroupNotEmpty
	// ErrInvalidArgument: any other bad input (negative or past-the-end offset, unknown
	// partition, bad reset mode, bad configuration).
	ErrInvalidArgument = sqlerr.ErrGroupInvalidArgument
	// ErrDeadLetterNotFound: no pending dead letter with that id.
	ErrDeadLetterNotFound = sqlerr.ErrDeadLetterNotFound
	// ErrNotOwned: a Consumer call named a partition this member does not own now.
	ErrNotOwned = errors.New("partition not owned by this member")
	// ErrAlreadyCommitted: Batch.CommitTx found the batch committed by an earlier
	// attempt (whose acknowledgement was lost); the transaction must be rolled back and
	// the handler may return the error: the worker counts the batch as done.
	ErrAlreadyCommitted = sqlerr.ErrAlreadyCommitted
)
