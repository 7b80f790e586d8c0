package consumergroup

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/streams"
)

// Batch is a run of consecutive events of one partition, handed to a Handler. It is
// valid only during the handler call.
type Batch struct {
	// Stream and Partition say where the events come from.
	Stream    string
	Partition int32
	// Group is the consumer group.
	Group string
	// MemberID and MemberEpoch identify the membership processing the batch (the fence
	// token its commits carry).
	MemberID    string
	MemberEpoch int64
	// Events are in offset order; never empty.
	Events []streams.Event
	// HighWatermark is the partition's log end when the batch was fetched (0 for a
	// redelivery).
	HighWatermark int64
	// Redelivered is true for a batch of this group's dead letters that an operator
	// replayed (Admin.ReplayDeadLetter): redelivered to this group only, before the
	// partition's next fetch. Events are the dead-lettered events as stored (their
	// partition, offset, id, key, payload and headers), in offset order; committing
	// the batch (Commit, CommitTx, or the worker after the handler returned nil) marks
	// them redelivered and moves no offset.
	Redelivered bool
	// DeadLetterIDs are the dead letters of a redelivered batch, one per event (nil
	// otherwise).
	DeadLetterIDs []int64

	w           *worker
	txCommitted bool
}

func (w *worker) newBatch(events []streams.Event, hwm int64) *Batch {
	return &Batch{Stream: w.c.cfg.Stream, Partition: w.partition, Group: w.c.cfg.Group,
		MemberID: w.m.consumerID, MemberEpoch: w.m.epoch, Events: events, HighWatermark: hwm, w: w}
}

// NextOffset is the offset after the batch's last event: what committing the batch
// stores (G5).
func (b *Batch) NextOffset() int64 { return b.Events[len(b.Events)-1].Offset + 1 }

// Commit commits the batch (NextOffset) now, for CommitManual mode (a redelivered
// batch: marks its dead letters redelivered). ErrFenced when this member no longer
// owns the partition at its epoch; nothing is written then.
func (b *Batch) Commit(ctx context.Context) error {
	if b.Redelivered {
		return b.w.m.redeliveriesDone(ctx, b.w.c.pool, b.Partition, b.DeadLetterIDs)
	}
	return b.w.c.commitRetry(ctx, b.w.m, []PartitionOffset{{Partition: b.Partition, Offset: b.NextOffset()}})
}

// CommitTx commits the batch's offset inside tx, the handler's own transaction, so
// that the handler's writes and the offset commit happen together or not at all (G4).
// The partition's ownership row stays locked (FOR KEY SHARE) until tx ends: a
// handover waits for it, so a commit accepted here can never be overtaken; the
// group's other operations (joins, heartbeats, pending moves, pause) do not wait.
// ErrFenced (and tx must be rolled back) when this member no longer owns the
// partition. Required in CommitTransactional mode; usable in any mode.
//
// The member's session is checked again when tx commits: if the member was expired
// or left the group while tx was open (a process frozen after CommitTx), tx's COMMIT
// fails with SQLSTATE SD108 (session expired) and nothing of tx is written; the partition then moves
// on. The worker treats a handler error carrying a fencing SQLSTATE as ErrFenced. The group never
// waits for such a transaction: only its partition does, until it ends (see the
// operations guide for idle_in_transaction_session_timeout).
//
// ErrAlreadyCommitted (roll tx back, and return the error) when an earlier attempt of
// this batch committed but its handler still failed (the commit's acknowledgement was
// lost): the writes must not happen twice, and the worker counts the batch as done.
// That holds when the attempts overlap too: while an earlier attempt's transaction is
// still open (its COMMIT in flight), CommitTx waits for it, and returns
// ErrAlreadyCommitted if it committed.
//
// A redelivered batch's CommitTx marks its dead letters redelivered inside tx instead
// (fenced the same way), and moves no offset.
func (b *Batch) CommitTx(ctx context.Context, tx pgx.Tx) error {
	if b.Redelivered {
		if err := b.w.m.redeliveriesDone(ctx, tx, b.Partition, b.DeadLetterIDs); err != nil {
			return err
		}
		b.txCommitted = true
		return nil
	}
	if err := b.w.m.commitBatch(ctx, tx, b.Partition, b.Events[0].Offset, b.NextOffset(), nil); err != nil {
		return err
	}
	b.txCommitted = true
	return nil
}
