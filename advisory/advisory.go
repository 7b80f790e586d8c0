// Package advisory names streamd's advisories, the operational events it appends to
// the stream streamd.advisories (docs/advisories.md), decodes them, and publishes the
// ones that Go code reports.
//
// Most advisories are written by the SQL function that does the fact they report, in
// its transaction (sql/functions/0150_advisories.sql): a dead letter, a member
// expired or fenced, a rebalance, retention deleting events a live group had not
// read, an offset reset. They exist exactly when their fact committed. The facts that
// happen in Go (the tailer falling back to polling or losing its replication slot, a
// leader taking the coordinator's lease) go through a Publisher, which never blocks the code
// that reports them: it buffers a bounded number and drops (and counts) the rest,
// and drops (and counts) those it fails to write.
//
// The stream is an ordinary stream of one partition, kept 7 days by a retention
// policy: any consumer group, `streamd advisories` (or `streamd fetch
// streamd.advisories`) and Kafka clients (topic streamd.advisories) read it. Each
// event's type is one of the Type constants, its key the subject (a group as
// "<stream>/<group>", a queue, a stream, a lease, a tailer), its data the JSON
// payload of the matching struct below.
package advisory

import (
	"encoding/json"
	"fmt"
	"time"
)

// Stream is the advisory stream's name.
const Stream = "streamd.advisories"

// The advisory types (the events' event_type), one per fact.
const (
	// TypeGroupDeadLettered: a consumer group's handler gave up on an event, which
	// went to the dead letter queue (GroupDeadLettered).
	TypeGroupDeadLettered = "streamd.group.dead_lettered"
	// TypeQueueDeadLettered: a queue message ran out of delivery attempts (or was
	// termed) and moved to its dead-letter queue (QueueDeadLettered).
	TypeQueueDeadLettered = "streamd.queue.dead_lettered"
	// TypeMemberExpired: a group member missed its session timeout or kept a
	// partition past its rebalance timeout, and was removed (MemberGone).
	TypeMemberExpired = "streamd.group.member_expired"
	// TypeMemberFenced: a group member was removed by another's act: a restart that
	// took its instance id, a forced offset reset, a forced group deletion
	// (MemberGone).
	TypeMemberFenced = "streamd.group.member_fenced"
	// TypeRebalanced: the assignor changed a group's assignment (Rebalanced).
	TypeRebalanced = "streamd.group.rebalanced"
	// TypeUnreadDeleted: retention moved a partition's log start past the committed
	// offset of a live group (UnreadDeleted).
	TypeUnreadDeleted = "streamd.retention.unread_deleted"
	// TypeOffsetsReset: a group's offsets were reset (OffsetsReset).
	TypeOffsetsReset = "streamd.group.offsets_reset"
	// TypeTailerPolling: the tailer cannot run (wal_level, privilege, publication)
	// and wake-ups come from polling alone (Tailer).
	TypeTailerPolling = "streamd.tailer.polling"
	// TypeTailerSlotLost: the tailer's replication connection, and with it its
	// temporary slot, was lost after it streamed; it reconnects (Tailer).
	TypeTailerSlotLost = "streamd.tailer.slot_lost"
	// TypeLeaderChanged: an instance took the coordinator's lease: a new leader, or
	// a new term (LeaderChanged).
	TypeLeaderChanged = "streamd.leader.changed"
)

// Types lists every advisory type.
var Types = []string{TypeGroupDeadLettered, TypeQueueDeadLettered, TypeMemberExpired, TypeMemberFenced,
	TypeRebalanced, TypeUnreadDeleted, TypeOffsetsReset, TypeTailerPolling, TypeTailerSlotLost, TypeLeaderChanged}

// GroupDeadLettered is the payload of TypeGroupDeadLettered: the event's provenance
// and the dead letter (consumergroup.Admin.DeadLetters) it became.
type GroupDeadLettered struct {
	Stream         string    `json:"stream"`
	Group          string    `json:"group"`
	Partition      int32     `json:"partition"`
	Offset         int64     `json:"offset"`
	EventID        string    `json:"event_id"`
	EventType      string    `json:"event_type"`
	Key            string    `json:"key,omitempty"`
	DeadLetterID   int64     `json:"dead_letter_id"`
	Member         string    `json:"member"`
	Epoch          int64     `json:"epoch"`
	Error          string    `json:"error"`
	Attempts       int       `json:"attempts"`
	FirstFailureAt time.Time `json:"first_failure_at"`
	LastFailureAt  time.Time `json:"last_failure_at"`
}

// QueueDeadLettered is the payload of TypeQueueDeadLettered: where the message came
// from and where it went.
type QueueDeadLettered struct {
	Queue            string    `json:"queue"`
	OriginOffset     int64     `json:"origin_offset"`
	MessageID        string    `json:"message_id"`
	DeadLetterQueue  string    `json:"dead_letter_queue"`
	DeadLetterOffset int64     `json:"dead_letter_offset"`
	Attempts         int       `json:"attempts"`
	Error            string    `json:"error,omitempty"`
	DeadLetteredAt   time.Time `json:"dead_lettered_at"`
}

// MemberGone is the payload of TypeMemberExpired and TypeMemberFenced.
type MemberGone struct {
	Stream     string `json:"stream"`
	Group      string `json:"group"`
	Member     string `json:"member"`
	Epoch      int64  `json:"epoch"`
	InstanceID string `json:"instance_id,omitempty"`
	// Reason: session_timeout or rebalance_timeout (expired); instance_replaced,
	// offsets_reset or group_deleted (fenced).
	Reason           string    `json:"reason"`
	LastHeartbeat    time.Time `json:"last_heartbeat"`
	SessionTimeoutMS int64     `json:"session_timeout_ms"`
	// Partitions are those the member owned when it went.
	Partitions []int32   `json:"partitions"`
	At         time.Time `json:"at"`
}

// Rebalanced is the payload of TypeRebalanced: the assignment after the change.
type Rebalanced struct {
	Stream     string         `json:"stream"`
	Group      string         `json:"group"`
	GroupEpoch int64          `json:"group_epoch"`
	Changed    int            `json:"changed"`
	Members    []MemberAssign `json:"members"`
	Unowned    []int32        `json:"unowned"`
	At         time.Time      `json:"at"`
}

// MemberAssign is one member's part of a Rebalanced: the partitions it owns and those
// promised to it, which move once their owner releases them.
type MemberAssign struct {
	Member     string  `json:"member"`
	Epoch      int64   `json:"epoch"`
	InstanceID string  `json:"instance_id,omitempty"`
	Owns       []int32 `json:"owns"`
	Incoming   []int32 `json:"incoming"`
}

// UnreadDeleted is the payload of TypeUnreadDeleted.
type UnreadDeleted struct {
	Stream                 string        `json:"stream"`
	Partition              int32         `json:"partition"`
	PreviousLogStartOffset int64         `json:"previous_log_start_offset"`
	LogStartOffset         int64         `json:"log_start_offset"`
	Groups                 []UnreadGroup `json:"groups"`
}

// UnreadGroup is a live group behind the new log start: UnreadDeleted events it had
// not read went.
type UnreadGroup struct {
	Group           string `json:"group"`
	CommittedOffset int64  `json:"committed_offset"`
	UnreadDeleted   int64  `json:"unread_deleted"`
}

// OffsetsReset is the payload of TypeOffsetsReset.
type OffsetsReset struct {
	Stream     string           `json:"stream"`
	Group      string           `json:"group"`
	Mode       string           `json:"mode"`
	Value      *int64           `json:"value,omitempty"`
	Time       *time.Time       `json:"time,omitempty"`
	Forced     bool             `json:"forced"`
	Partitions []PartitionReset `json:"partitions"`
	At         time.Time        `json:"at"`
}

// PartitionReset is one partition of an OffsetsReset (PreviousOffset nil: the group
// had no commit there).
type PartitionReset struct {
	Partition      int32  `json:"partition"`
	PreviousOffset *int64 `json:"previous_offset,omitempty"`
	NewOffset      int64  `json:"new_offset"`
}

// Tailer is the payload of TypeTailerPolling and TypeTailerSlotLost.
type Tailer struct {
	// Tailer is the replication connection's application_name.
	Tailer string `json:"tailer"`
	// Reason (TypeTailerPolling): wal_level, privilege or publication.
	Reason string    `json:"reason,omitempty"`
	Error  string    `json:"error"`
	At     time.Time `json:"at"`
}

// LeaderChanged is the payload of TypeLeaderChanged: the instance (Holder) that took
// the lease, and the term (Epoch, which grows with every change of holder).
type LeaderChanged struct {
	Lease  string    `json:"lease"`
	Holder string    `json:"holder"`
	Epoch  int64     `json:"epoch"`
	At     time.Time `json:"at"`
}

// Decode returns the payload of an event of the advisory stream (its event type and
// data) as the struct its type names (a pointer, e.g. *GroupDeadLettered). An unknown
// type is an error.
func Decode(eventType string, data []byte) (any, error) {
	var v any
	switch eventType {
	case TypeGroupDeadLettered:
		v = &GroupDeadLettered{}
	case TypeQueueDeadLettered:
		v = &QueueDeadLettered{}
	case TypeMemberExpired, TypeMemberFenced:
		v = &MemberGone{}
	case TypeRebalanced:
		v = &Rebalanced{}
	case TypeUnreadDeleted:
		v = &UnreadDeleted{}
	case TypeOffsetsReset:
		v = &OffsetsReset{}
	case TypeTailerPolling, TypeTailerSlotLost:
		v = &Tailer{}
	case TypeLeaderChanged:
		v = &LeaderChanged{}
	default:
		return nil, fmt.Errorf("advisory: unknown type %q", eventType)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return nil, fmt.Errorf("advisory: decode %s: %w", eventType, err)
	}
	return v, nil
}
