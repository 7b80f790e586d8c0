package consumergroup

import (
	"errors"
	"fmt"

	"github.com/streamd/streamd/internal/sqlerr"
)

// Conditions the consumer group reports. Each is matched with errors.Is; the error's
// text says which group, member, partition or value was wrong. Errors raised by
// streamd's SQL also unwrap to the *pgconn.PgError PostgreSQL returned.
var (
	// ErrFenced: the member is not a live member of the group at its epoch (its session
	// expired, it left, or a restart with its instance id replaced it), or it does not
	// own the partition it commits. Nothing was written. The error is a *FencedError,
	// whose Reason says which. The Consumer reacts by dropping its partitions (OnLost)
	// and joining again, unless another live member now holds its InstanceID: then Run
	// returns ErrInstanceFenced.
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

// FenceReason says why a member's call was fenced.
type FenceReason int

const (
	// FenceSessionExpired: the member's session ended: no heartbeat within its
	// SessionTimeout, or it is no longer registered (its expiry was processed, it
	// left, a restart with its instance id replaced it, or an admin reset removed it).
	// It must join again.
	FenceSessionExpired FenceReason = iota + 1
	// FencePartitionMoved: the member is live at its epoch, but the partition is no
	// longer its own (a rebalance moved it to another member). Only that partition is
	// lost; the membership goes on.
	FencePartitionMoved
	// FenceStaleEpoch: the member is registered under a newer epoch than the call
	// carried (the call belongs to an earlier membership).
	FenceStaleEpoch
)

func (r FenceReason) String() string {
	switch r {
	case FenceSessionExpired:
		return "session expired"
	case FencePartitionMoved:
		return "partition moved"
	case FenceStaleEpoch:
		return "stale epoch"
	}
	return fmt.Sprintf("FenceReason(%d)", int(r))
}

// FencedError is the error of a call the group refused because the member was fenced,
// with the reason (as Kafka tells UNKNOWN_MEMBER_ID from a stale member epoch). It
// matches ErrFenced with errors.Is, and unwraps to the *pgconn.PgError, whose Message
// names the group, member, epoch and partition. Nothing was written.
type FencedError struct {
	// Reason is why the member was fenced.
	Reason FenceReason
	// Stream, Group, MemberID and MemberEpoch name the membership that made the call.
	Stream      string
	Group       string
	MemberID    string
	MemberEpoch int64
	// Partition is the partition of a refused single-partition call (CommitTx,
	// Batch.Commit, a dead letter); -1 for a heartbeat, release or a commit of several
	// partitions (the error's text names the first one refused).
	Partition int32

	err error // the *sqlerr.Error
}

// Error is the database's message ("fenced: member m (epoch e) of group ... is fenced:
// session expired (...)").
func (e *FencedError) Error() string { return e.err.Error() }

// Is reports whether target is ErrFenced.
func (e *FencedError) Is(target error) bool { return target == ErrFenced }

// Unwrap returns the database error (which unwraps to the *pgconn.PgError).
func (e *FencedError) Unwrap() error { return e.err }

// fenced returns err as a *FencedError when the database fenced m's call (one of
// partition, or of several when partition is -1), and sqlerr.Wrap(err) otherwise.
func fenced(err error, m *member, partition int32) error {
	var reason FenceReason
	switch sqlerr.Code(err) {
	case sqlerr.FencedSession:
		reason = FenceSessionExpired
	case sqlerr.FencedPartition:
		reason = FencePartitionMoved
	case sqlerr.FencedEpoch:
		reason = FenceStaleEpoch
	case sqlerr.Fenced: // not raised by this schema's functions; the safe reading
		reason = FenceSessionExpired
	default:
		return sqlerr.Wrap(err)
	}
	return &FencedError{Reason: reason, Stream: m.stream, Group: m.group, MemberID: m.consumerID,
		MemberEpoch: m.epoch, Partition: partition, err: sqlerr.Wrap(err)}
}
