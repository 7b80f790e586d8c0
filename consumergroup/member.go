package consumergroup

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// This file is the one place that calls the group functions of
// sql/functions/0200_consumer_groups.sql. Each takes the time as a parameter (nil
// means the database's now()) so tests can control it.

// member is one membership of a group: the identity and fence token (the member
// epoch) that every call after the join carries. A member is immutable; joining again
// makes a new one.
type member struct {
	stream     string
	group      string
	consumerID string
	instanceID string
	epoch      int64
}

// Assignment is what the group coordinator tells a member on a heartbeat.
type Assignment struct {
	// Assigned are the partitions the member owns now, ascending.
	Assigned []int32
	// Revoking are the owned partitions that another member waits for: the member
	// finishes its in-flight batch, commits, and releases them.
	Revoking []int32
	// Paused are the owned partitions the group paused.
	Paused []int32
}

// PartitionOffset is a committed position: Offset is the next offset to read (G5).
type PartitionOffset struct {
	Partition int32
	Offset    int64
	// Metadata is an optional free-form string stored with the offset.
	Metadata string
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// memberJoin joins consumerID to the group and returns the member with its epoch.
func memberJoin(ctx context.Context, db streams.DBTX, stream, group, consumerID, instanceID string,
	session, rebalance time.Duration, now *time.Time) (*member, error) {
	var epoch int64
	err := db.QueryRow(ctx, "SELECT streamd.join_group($1, $2, $3, $4, $5, $6, $7)",
		stream, group, consumerID, nullable(instanceID), session.Milliseconds(), rebalance.Milliseconds(), now).Scan(&epoch)
	if err != nil {
		return nil, fmt.Errorf("join group %s of %s as %s: %w", group, stream, consumerID, sqlerr.Wrap(err))
	}
	return &member{stream: stream, group: group, consumerID: consumerID, instanceID: instanceID, epoch: epoch}, nil
}

// heartbeat records that m is alive and returns its assignment; ErrFenced when m is
// no longer a member at its epoch.
func (m *member) heartbeat(ctx context.Context, db streams.DBTX, now *time.Time) (Assignment, error) {
	var a Assignment
	err := db.QueryRow(ctx, "SELECT assigned, revoking, paused FROM streamd.group_heartbeat($1, $2, $3, $4, $5)",
		m.stream, m.group, m.consumerID, m.epoch, now).Scan(&a.Assigned, &a.Revoking, &a.Paused)
	if err != nil {
		return a, fmt.Errorf("heartbeat %s in group %s of %s: %w", m.consumerID, m.group, m.stream, fenced(err, m, -1))
	}
	return a, nil
}

// release hands partitions m owns over to the members waiting for them.
func (m *member) release(ctx context.Context, db streams.DBTX, partitions []int32, now *time.Time) error {
	_, err := db.Exec(ctx, "SELECT streamd.release_partitions($1, $2, $3, $4, $5, $6)",
		m.stream, m.group, m.consumerID, m.epoch, partitions, now)
	if err != nil {
		return fmt.Errorf("release partitions %v of group %s of %s: %w", partitions, m.group, m.stream, fenced(err, m, -1))
	}
	return nil
}

// leave removes m from the group; its partitions are reassigned at once. It reports
// false when m was not a member any more.
func (m *member) leave(ctx context.Context, db streams.DBTX, now *time.Time) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, "SELECT streamd.leave_group($1, $2, $3, $4, $5)",
		m.stream, m.group, m.consumerID, m.epoch, now).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("leave group %s of %s: %w", m.group, m.stream, sqlerr.Wrap(err))
	}
	return ok, nil
}

// commit commits offsets for partitions m owns, all or nothing; ErrFenced when m does
// not own one of them at its epoch.
func (m *member) commit(ctx context.Context, db streams.DBTX, offsets []PartitionOffset, now *time.Time) error {
	if len(offsets) == 0 {
		return nil
	}
	parts := make([]int32, len(offsets))
	offs := make([]int64, len(offsets))
	meta := make([]*string, len(offsets))
	for i, o := range offsets {
		if o.Offset < 0 {
			return fmt.Errorf("%w: commit offset %d for %s/%d is negative", ErrInvalidArgument, o.Offset, m.stream, o.Partition)
		}
		parts[i], offs[i], meta[i] = o.Partition, o.Offset, nullable(o.Metadata)
	}
	_, err := db.Exec(ctx, "SELECT streamd.commit_offsets($1, $2, $3, $4, $5, $6, $7, $8)",
		m.stream, m.group, m.consumerID, m.epoch, parts, offs, meta, now)
	if err != nil {
		p := int32(-1)
		if len(offsets) == 1 {
			p = offsets[0].Partition
		}
		return fmt.Errorf("commit offsets of group %s of %s: %w", m.group, m.stream, fenced(err, m, p))
	}
	return nil
}

// commitBatch commits the batch [from, next) of partition inside the caller's
// transaction, fenced like commit and only once: ErrAlreadyCommitted when the group's
// offset is already past from (an earlier attempt of the batch committed).
func (m *member) commitBatch(ctx context.Context, db streams.DBTX, partition int32, from, next int64, now *time.Time) error {
	_, err := db.Exec(ctx, "SELECT streamd.commit_batch($1, $2, $3, $4, $5, $6, $7, $8)",
		m.stream, m.group, m.consumerID, m.epoch, partition, from, next, now)
	if err != nil {
		return fmt.Errorf("commit batch [%d, %d) of %s/%d for group %s: %w", from, next, m.stream, partition, m.group, fenced(err, m, partition))
	}
	return nil
}

// deadLetter copies the event at (partition, offset) into the dead letter queue,
// fenced like a commit.
func (m *member) deadLetter(ctx context.Context, db streams.DBTX, partition int32, offset int64, cause, detail string,
	attempts int, firstFailure time.Time) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, "SELECT streamd.dead_letter_event($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL)",
		m.stream, m.group, m.consumerID, m.epoch, partition, offset, cause, detail, attempts, firstFailure).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("dead letter %s/%d@%d for group %s: %w", m.stream, partition, offset, m.group, fenced(err, m, partition))
	}
	return id, nil
}

// committedOffset returns the group's committed offset of a partition, and false when
// there is none.
func committedOffset(ctx context.Context, db streams.DBTX, stream, group string, partition int32) (int64, bool, error) {
	var off *int64
	err := db.QueryRow(ctx, `SELECT (SELECT "offset" FROM streamd.consumer_offsets
		WHERE stream_name = $1 AND group_id = $2 AND partition = $3)`, stream, group, partition).Scan(&off)
	if err != nil {
		return 0, false, fmt.Errorf("read committed offset of %s/%d for group %s: %w", stream, partition, group, err)
	}
	if off == nil {
		return 0, false, nil
	}
	return *off, true, nil
}

// instanceHolder returns the member that holds instanceID in the group with a live
// session, "" when none does.
func instanceHolder(ctx context.Context, db streams.DBTX, stream, group, instanceID string) (string, error) {
	var holder *string
	err := db.QueryRow(ctx, `SELECT (SELECT consumer_id FROM streamd.consumer_registrations
		WHERE stream_name = $1 AND group_id = $2 AND instance_id = $3
		  AND last_heartbeat + session_timeout_ms * interval '1 millisecond' >= now())`,
		stream, group, instanceID).Scan(&holder)
	if err != nil {
		return "", fmt.Errorf("read holder of instance id %q in group %s of %s: %w", instanceID, group, stream, sqlerr.Wrap(err))
	}
	if holder == nil {
		return "", nil
	}
	return *holder, nil
}

// groupChannel is the group's LISTEN/NOTIFY channel (streamd.cg_channel).
func groupChannel(stream, group string) string {
	return "streamd_group_" + md5hex(stream+"/"+group)
}

// md5hex matches PostgreSQL's md5(text), for channel names; not used for security.
func md5hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}
