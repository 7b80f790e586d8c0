// Package consumergroup is the consumer group: membership, server-side partition
// assignment, offset commits with fencing, and the processing loop (G1-G5 in
// DESIGN.md).
//
//	c, err := consumergroup.New(pool, &consumergroup.Config{Stream: "orders", Group: "billing"})
//	err = c.Run(ctx, func(ctx context.Context, b *consumergroup.Batch) error { ...; return nil })
//
// # How it works
//
// All coordination is in PostgreSQL (sql/functions/0200_consumer_groups.sql), in the
// spirit of Kafka's KIP-848. A member joins (join_group) and gets a member epoch, its
// fence token. The assignor (cg_assign) runs under the group row's lock on every
// membership change: sticky and balanced (owned counts differ by at most one; a
// member keeps what it holds up to its quota). A partition that must move gets a
// pending target; the owner learns it on its next heartbeat (group_heartbeat, woken at
// once by NOTIFY on the group's channel), finishes its in-flight batch, commits, calls
// OnRevoked and releases it (release_partitions); only then does the target own it. A
// member whose session expires is removed by any other member's heartbeat (or by
// cleanup_stale_consumers) and its partitions move at once.
//
// A commit (commit_offsets) locks the partition's ownership row FOR KEY SHARE where the
// member owns it at its epoch and its session is live, and writes the offset in the
// same transaction; a handover locks that row FOR UPDATE before it changes the owner,
// so it waits for an in-flight commit or makes it find nothing (ErrFenced, nothing
// written). CommitTx holds the lock until the handler's transaction ends; updates
// that move nothing (a pending target, pause) do not wait for it, and neither do the
// departures of a member (expiry, leave, a static restart): they skip the rows its
// in-flight commits hold, which move once those transactions ended, and such a
// transaction is refused at its COMMIT (SD108, read as ErrFenced) since its member is
// gone. A member frozen inside CommitTx so costs only its own partitions.
//
// # Files
//
//	member.go    the SQL calls of one membership (join, heartbeat, release, leave, commit)
//	consumer.go  Consumer, Run, the session loop (heartbeats, reconcile, hooks)
//	worker.go    one partition's loop: start position, fetch (10 batches at once, one fetch ahead), handler retries, commit
//	committer.go the membership's asynchronous, coalesced CommitAuto commits
//	batch.go     Batch, Commit, CommitTx
//	listener.go  the LISTEN connection that wakes the session loop
//	admin.go     Admin: list, describe, reset offsets, delete, pause, dead letters
//	admin_offsets.go  Admin: export a group's offsets, set them back (kafka-consumer-groups --export, --from-file)
//	config.go    Config and its validation; metrics.go the Prometheus collectors
//	classic.go   Classic: the coordinator of Kafka classic-protocol groups (package kafka)
//	classic_admin.go  their listing, description, deletion and offset deletion
//	kip848.go    Kafka KIP-848 members (ConsumerGroupHeartbeat): one Kafka member epoch and a
//	             subscription (names, regex) over one native membership per stream
//
// # Goroutines
//
// Run owns the listener goroutine (exits when Run returns) and runs the session loop
// itself. While the session loop runs a hook, a release or its shutdown's wait for the
// workers, a heartbeat goroutine it owns (whileHeartbeating) heartbeats in its place;
// it exits when that call returns or after MaxPollInterval. The session loop owns one worker goroutine per owned partition: it stops a
// worker on revoke (the worker finishes its batch and commits), cancels it when the
// partition is lost, and waits for every worker before the session ends. A worker's
// ctx (its handlers') is not Run's: when Run's ctx is cancelled, the session loop
// stops the workers (they finish and commit their in-flight batches) and cancels
// their ctx only after DrainTimeout (a timer it owns, stopped when the workers are
// done); then OnRevoked runs and the member leaves. A worker owns a small goroutine
// that cancels its fetch on stop (exits with the worker), and the goroutine of the
// fetch it runs ahead while its handler works (at most one; the worker waits for it,
// or cancels and waits for it, before it exits). The session owns the membership's
// committer goroutine (committer.go): started with the session, stopped after every
// worker exited.
// Cleanup after cancellation (final commit, OnRevoked context, leave) runs under
// context.WithoutCancel plus a 10s timeout.
//
// # Non-obvious invariants
//
//   - Lock order everywhere: group row, registrations, partition rows ascending.
//     Commits lock only partition rows, so they cannot deadlock with a rebalance.
//   - Every join gets a fresh member id, so a fenced member can never be mistaken for
//     its successor; static membership (InstanceID) transfers the old member's
//     partitions to the new id and epoch in the join itself. A static member fenced
//     while another live member holds its instance id stops (ErrInstanceFenced).
//   - commit_batch refuses an already committed batch in the offset write's own
//     condition, so overlapping attempts of one batch commit once (G4).
//   - A heartbeat from a member past its session timeout is refused even before any
//     reaper removed it, and so is its commit, also at the COMMIT of a CommitTx
//     transaction.
//   - Times follow the clock rule (DESIGN.md): clock_timestamp() after the locks a
//     function waits for, so a join or heartbeat that waited for the group row is not
//     registered already expired, and CommitTx judges the session at the call, not
//     at the start of the handler's transaction.
//   - CommitAuto commits are asynchronous and coalesced: a worker hands the committer
//     the offset after its handler returned for a batch (never before: G4) and goes
//     on; the committer writes the member's due offsets as one commit_offsets
//     statement, at most every CommitInterval, fenced by the epoch like any commit.
//     A fenced statement of several partitions is retried partition by partition,
//     so only the partitions refused are lost. A worker that exits (revoke, drain,
//     loss) first waits for its partition's offsets to be written or refused, so
//     OnRevoked and the release still come after the partition's last commit.
//   - A batch fetched ahead is never handed to the handler once the worker was told
//     to stop or the partition was paused: it is dropped and fetched again.
//   - A worker that was stopped while its handler was blocked (ErrorBlock) exits
//     without committing: the next owner redelivers the batch (at-least-once).
//   - A partition assigned to a membership ends in exactly one of OnRevoked (clean:
//     its batches finished and committed, the member still owned it during the call)
//     and OnLost (fenced, expired or MaxPollInterval: another member may own it). A
//     drain cut short by DrainTimeout is still a revoke: the member owns the
//     partition until it leaves; only the cut batch goes uncommitted.
package consumergroup
