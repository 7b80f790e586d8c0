package consumergroup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// This file is the coordinator of Kafka classic-protocol groups (JoinGroup,
// SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch); classic_admin.go has
// the administration (ListGroups, DescribeGroups, DeleteGroups, OffsetDelete). It is
// the one place that calls sql/functions/0220_kafka_groups.sql. The assignment is the
// client's (the group leader computes it: range, roundrobin, cooperative-sticky...);
// the coordinator only forms generations, fences them and hands the leader's
// assignment out.

// Conditions of classic groups, matched with errors.Is; each is a Kafka error code of
// the same name, and the error's text says which group, member or generation.
var (
	// ErrUnknownMember: the group has no such live member (it left, its session
	// expired, it was removed at a rebalance deadline, or it never joined). Kafka's
	// UNKNOWN_MEMBER_ID: the client joins again with no member id.
	ErrUnknownMember = sqlerr.ErrUnknownMember
	// ErrIllegalGeneration: the request names a generation that is not the group's
	// current one (Kafka's ILLEGAL_GENERATION): the member was left behind by a
	// rebalance and must join again; a commit with it is refused and writes nothing.
	ErrIllegalGeneration = sqlerr.ErrIllegalGeneration
	// ErrRebalanceInProgress: the group is rebalancing (Kafka's REBALANCE_IN_PROGRESS):
	// the member must join again. Commits are refused with it only between JoinGroup and
	// SyncGroup of a new generation.
	ErrRebalanceInProgress = sqlerr.ErrRebalanceInProgress
	// ErrInconsistentGroupProtocol: the member's protocol type or protocols do not match
	// the group's members, or the group id belongs to a streamd (native or KIP-848)
	// group with live members (Kafka's INCONSISTENT_GROUP_PROTOCOL).
	ErrInconsistentGroupProtocol = sqlerr.ErrInconsistentGroupProtocol
)

// ConsumerHeartbeatInterval is the heartbeat interval KIP-848 members are given.
func (c *Classic) ConsumerHeartbeatInterval() time.Duration { return c.cfg.ConsumerHeartbeatInterval }

// MemberIDRequiredError is Join's answer to a new dynamic member when
// ClassicJoin.RequireKnownMemberID is set (JoinGroup v4+, Kafka's MEMBER_ID_REQUIRED):
// nothing was written; the client joins again with MemberID.
type MemberIDRequiredError struct {
	Group    string
	MemberID string
}

func (e *MemberIDRequiredError) Error() string {
	return fmt.Sprintf("join group %s: member id required: join again as %s", e.Group, e.MemberID)
}

// ClassicConfig configures a Classic coordinator (of classic groups and of KIP-848
// members, kip848.go). The zero value is valid.
type ClassicConfig struct {
	// ConsumerHeartbeatInterval is how often KIP-848 members are told to heartbeat.
	// Defaults to 5s (Kafka's group.consumer.heartbeat.interval.ms), capped at a third
	// of ConsumerSessionTimeout.
	ConsumerHeartbeatInterval time.Duration
	// ConsumerSessionTimeout is the session timeout of KIP-848 members (Kafka's
	// group.consumer.session.timeout.ms). Defaults to 45s.
	ConsumerSessionTimeout time.Duration
	// PollInterval is how often a JoinGroup or SyncGroup waiting for other members
	// checks the group (each check also counts as the waiting member's heartbeat).
	// Defaults to 25ms.
	PollInterval time.Duration
}

func (c *ClassicConfig) validate() error {
	if c.ConsumerHeartbeatInterval < 0 || c.ConsumerSessionTimeout < 0 {
		return fmt.Errorf("classic group config: ConsumerHeartbeatInterval %v and ConsumerSessionTimeout %v must not be negative: %w",
			c.ConsumerHeartbeatInterval, c.ConsumerSessionTimeout, ErrInvalidArgument)
	}
	if c.PollInterval < 0 {
		return fmt.Errorf("classic group config: PollInterval %v is negative: %w", c.PollInterval, ErrInvalidArgument)
	}
	return nil
}

// Classic coordinates Kafka classic-protocol groups whose state lives in PostgreSQL
// (streamd.kafka_groups), so any number of Classic values, in any processes on the
// same database, coordinate the same groups: a client that loses one streamd instance
// carries on against another. It is safe for concurrent use; it holds no state of its
// own besides its configuration.
//
// Committed offsets are the rows native groups use (streamd.consumer_offsets, per
// stream, group and partition), so lag, consumer_group_status and consumer-aware
// retention see Kafka groups too.
type Classic struct {
	pool *pgxpool.Pool
	cfg  ClassicConfig
	// now is the time passed to the SQL functions; nil means the database's clock.
	// Tests set it.
	now func() *time.Time
	// subs caches KIP-848 subscriptions (kip848_cache.go).
	subs *subscriptionCache
}

// NewClassic returns a coordinator of classic groups on pool. cfg nil means the
// defaults; ErrInvalidArgument names a bad field.
func NewClassic(pool *pgxpool.Pool, cfg *ClassicConfig) (*Classic, error) {
	c := &Classic{pool: pool, now: func() *time.Time { return nil }, subs: newSubscriptionCache()}
	if cfg != nil {
		c.cfg = *cfg
	}
	if err := c.cfg.validate(); err != nil {
		return nil, err
	}
	if c.cfg.PollInterval == 0 {
		c.cfg.PollInterval = 25 * time.Millisecond
	}
	if c.cfg.ConsumerSessionTimeout == 0 {
		c.cfg.ConsumerSessionTimeout = 45 * time.Second
	}
	if c.cfg.ConsumerHeartbeatInterval == 0 {
		c.cfg.ConsumerHeartbeatInterval = 5 * time.Second
	}
	c.cfg.ConsumerHeartbeatInterval = min(c.cfg.ConsumerHeartbeatInterval, c.cfg.ConsumerSessionTimeout/3)
	return c, nil
}

// ClassicProtocol is one assignor a member supports, with its metadata (for the
// "consumer" protocol type, a serialized ConsumerMemberMetadata the leader decodes).
type ClassicProtocol struct {
	Name     string
	Metadata []byte
}

// ClassicJoin is a JoinGroup request.
type ClassicJoin struct {
	Group string
	// MemberID is "" for a member joining for the first time.
	MemberID string
	// InstanceID makes the member static (group.instance.id); "" for dynamic.
	InstanceID string
	ClientID   string
	ClientHost string
	// SessionTimeout: without a heartbeat (or a pending JoinGroup or SyncGroup poll)
	// for this long the member is removed. Must be positive.
	SessionTimeout time.Duration
	// RebalanceTimeout: how long a rebalance waits for members to rejoin. Must be
	// positive.
	RebalanceTimeout time.Duration
	// ProtocolType is "consumer" for Kafka consumers; required.
	ProtocolType string
	// Protocols in the member's order of preference; at least one.
	Protocols []ClassicProtocol
	// Topics is the member's subscription when the wire layer could decode it (for the
	// "consumer" protocol type); OffsetDelete refuses to delete offsets of streams a
	// live member subscribes to.
	Topics []string
	// RequireKnownMemberID: a dynamic member joining with no member id gets a
	// *MemberIDRequiredError with its id instead of joining (JoinGroup v4+).
	RequireKnownMemberID bool
}

// ClassicGeneration is a JoinGroup response: the generation the member is part of.
type ClassicGeneration struct {
	MemberID     string
	Generation   int32
	ProtocolType string
	// Protocol is the assignor chosen for the generation.
	Protocol string
	Leader   string
	// Members is the generation's members with their metadata for Protocol, only when
	// this member leads it (it computes the assignment), in the order they joined.
	Members []ClassicMember
}

// ClassicMember is a member of a generation as its leader sees it.
type ClassicMember struct {
	MemberID   string
	InstanceID string
	Metadata   []byte
}

// Join adds the member to the group (or updates it) and waits until it is part of a
// generation: when every member rejoined, or the rebalance timeout passed and those
// that did not were removed. It polls every PollInterval; each poll counts as the
// member's heartbeat, and it returns ctx's error when ctx ends first (the member stays
// in the group until its session times out, as in Kafka).
//
// Errors: *MemberIDRequiredError; ErrInconsistentGroupProtocol; ErrInstanceFenced (a
// static member's id is held by another member id); ErrUnknownMember (removed while
// waiting); ErrInvalidGroupID; ErrInvalidArgument.
func (c *Classic) Join(ctx context.Context, req *ClassicJoin) (*ClassicGeneration, error) {
	names := make([]string, len(req.Protocols))
	metas := make([][]byte, len(req.Protocols))
	for i, p := range req.Protocols {
		names[i], metas[i] = p.Name, nonNilBytes(p.Metadata)
	}
	var (
		id       string
		outcome  string
		waitGen  int32
		clientID = req.ClientID
	)
	if clientID == "" {
		clientID = "member"
	}
	err := c.pool.QueryRow(ctx, `SELECT member_id, outcome, wait_generation FROM streamd.kafka_group_join(
		$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		req.Group, req.MemberID, nullable(req.InstanceID), clientID+"-"+randomID(), req.RequireKnownMemberID,
		req.ClientID, req.ClientHost, req.SessionTimeout.Milliseconds(), req.RebalanceTimeout.Milliseconds(),
		req.ProtocolType, names, metas, nonNilStrings(req.Topics), c.now()).Scan(&id, &outcome, &waitGen)
	if err != nil {
		return nil, fmt.Errorf("join group %s: %w", req.Group, sqlerr.Wrap(err))
	}
	if outcome == "member_id_required" {
		return nil, &MemberIDRequiredError{Group: req.Group, MemberID: id}
	}
	for {
		g := ClassicGeneration{MemberID: id}
		var (
			ids, instances []*string
			metadata       [][]byte
			protocolType   *string
			protocol       *string
			leader         *string
			generation     *int32
		)
		err := c.pool.QueryRow(ctx, `SELECT outcome, generation, protocol_type, protocol_name, leader_id,
			member_ids, instance_ids, metadata FROM streamd.kafka_group_join_poll($1, $2, $3, $4)`,
			req.Group, id, waitGen, c.now()).Scan(&outcome, &generation, &protocolType, &protocol, &leader,
			&ids, &instances, &metadata)
		if err != nil {
			return nil, fmt.Errorf("join group %s as %s: %w", req.Group, id, sqlerr.Wrap(err))
		}
		switch outcome {
		case "unknown":
			return nil, fmt.Errorf("join group %s as %s: removed while waiting for the rebalance: %w", req.Group, id, ErrUnknownMember)
		case "done":
			g.Generation, g.ProtocolType, g.Protocol, g.Leader = *generation, deref(protocolType), deref(protocol), deref(leader)
			for i := range ids {
				g.Members = append(g.Members, ClassicMember{MemberID: deref(ids[i]), InstanceID: deref(instances[i]), Metadata: metadata[i]})
			}
			return &g, nil
		}
		if err := sleepCtx(ctx, c.cfg.PollInterval); err != nil {
			return nil, fmt.Errorf("join group %s as %s: %w", req.Group, id, err)
		}
	}
}

// ClassicSync is a SyncGroup request.
type ClassicSync struct {
	Group      string
	MemberID   string
	InstanceID string
	Generation int32
	// ProtocolType and Protocol, when not "", must be the group's (SyncGroup v5+).
	ProtocolType string
	Protocol     string
	// Assignments: the leader's assignment of the generation; members it does not name
	// get an empty one. Ignored from followers.
	Assignments []ClassicAssignment
}

// ClassicAssignment is one member's assignment, opaque to the coordinator (for the
// "consumer" protocol type, a serialized ConsumerMemberAssignment).
type ClassicAssignment struct {
	MemberID   string
	Assignment []byte
	// Partitions is what Assignment gives the member, when the wire layer could decode
	// it (protocol type "consumer"): consumer_group_status then shows the member as
	// their owner. Unknown streams and partitions are left out.
	Partitions []StreamPartition
}

// ClassicSyncResult is a SyncGroup response.
type ClassicSyncResult struct {
	ProtocolType string
	Protocol     string
	Assignment   []byte
}

// Sync stores the leader's assignment, or waits for it (polling, each poll a
// heartbeat), and returns the member's. Errors: ErrUnknownMember, ErrInstanceFenced,
// ErrIllegalGeneration, ErrRebalanceInProgress (a new rebalance began: join again),
// ErrInconsistentGroupProtocol, ctx's error.
func (c *Classic) Sync(ctx context.Context, req *ClassicSync) (*ClassicSyncResult, error) {
	// Non-nil even when empty: a leader with nothing to assign still stores that.
	ids, assignments := make([]string, len(req.Assignments)), make([][]byte, len(req.Assignments))
	ownedIDs, ownedStreams, ownedParts := []string{}, []string{}, []int32{}
	for i, a := range req.Assignments {
		ids[i], assignments[i] = a.MemberID, nonNilBytes(a.Assignment)
		for _, p := range a.Partitions {
			ownedIDs, ownedStreams, ownedParts = append(ownedIDs, a.MemberID), append(ownedStreams, p.Stream), append(ownedParts, p.Partition)
		}
	}
	for {
		var (
			outcome      string
			res          ClassicSyncResult
			protocolType *string
			protocol     *string
		)
		err := c.pool.QueryRow(ctx, `SELECT outcome, assignment, protocol_type, protocol_name
			FROM streamd.kafka_group_sync($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
			req.Group, req.MemberID, nullable(req.InstanceID), req.Generation, req.ProtocolType, req.Protocol,
			ids, assignments, ownedIDs, ownedStreams, ownedParts, c.now()).Scan(&outcome, &res.Assignment, &protocolType, &protocol)
		if err != nil {
			return nil, fmt.Errorf("sync group %s as %s (generation %d): %w", req.Group, req.MemberID, req.Generation, sqlerr.Wrap(err))
		}
		if outcome == "done" {
			res.ProtocolType, res.Protocol = deref(protocolType), deref(protocol)
			if res.Assignment == nil {
				res.Assignment = []byte{}
			}
			return &res, nil
		}
		if err := sleepCtx(ctx, c.cfg.PollInterval); err != nil {
			return nil, fmt.Errorf("sync group %s as %s: %w", req.Group, req.MemberID, err)
		}
	}
}

// Heartbeat records that the member is alive. Errors: ErrUnknownMember,
// ErrInstanceFenced, ErrIllegalGeneration, ErrRebalanceInProgress (the member must
// join again; its heartbeat still counted).
func (c *Classic) Heartbeat(ctx context.Context, group, memberID, instanceID string, generation int32) error {
	var outcome string
	err := c.pool.QueryRow(ctx, "SELECT streamd.kafka_group_heartbeat($1, $2, $3, $4, $5)",
		group, memberID, nullable(instanceID), generation, c.now()).Scan(&outcome)
	if err != nil {
		return fmt.Errorf("heartbeat %s in group %s (generation %d): %w", memberID, group, generation, sqlerr.Wrap(err))
	}
	switch outcome {
	case "illegal_generation":
		return fmt.Errorf("heartbeat %s in group %s: generation %d is not the group's: %w", memberID, group, generation, ErrIllegalGeneration)
	case "rebalance_in_progress":
		return fmt.Errorf("heartbeat %s in group %s: %w", memberID, group, ErrRebalanceInProgress)
	}
	return nil
}

// ClassicLeaver names a member leaving: by MemberID, or by InstanceID for a static
// member (then a MemberID, when given, must be the instance's current one).
type ClassicLeaver struct {
	MemberID   string
	InstanceID string
}

// Leave removes members from the group, which rebalances the others. It returns one
// error per leaver (nil, ErrUnknownMember or ErrInstanceFenced) and an error for the
// request as a whole (ErrInvalidGroupID).
func (c *Classic) Leave(ctx context.Context, group string, leavers []ClassicLeaver) ([]error, error) {
	ids := make([]string, len(leavers))
	instances := make([]*string, len(leavers))
	for i, l := range leavers {
		ids[i], instances[i] = l.MemberID, nullable(l.InstanceID)
	}
	rows, err := c.pool.Query(ctx, "SELECT outcome FROM streamd.kafka_group_leave($1, $2, $3, $4)", group, ids, instances, c.now())
	if err != nil {
		return nil, fmt.Errorf("leave group %s: %w", group, sqlerr.Wrap(err))
	}
	outcomes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("leave group %s: %w", group, sqlerr.Wrap(err))
	}
	out := make([]error, len(outcomes))
	for i, o := range outcomes {
		switch o {
		case "unknown_member":
			out[i] = fmt.Errorf("leave group %s: %s: %w", group, leavers[i].MemberID, ErrUnknownMember)
		case "fenced_instance":
			out[i] = fmt.Errorf("leave group %s: instance %s is held by another member than %s: %w",
				group, leavers[i].InstanceID, leavers[i].MemberID, ErrInstanceFenced)
		}
	}
	return out, nil
}

// StreamOffset is a committed offset of one partition of a stream (a Kafka topic).
type StreamOffset struct {
	Stream    string
	Partition int32
	// Offset is the next offset to read (G5).
	Offset   int64
	Metadata string
	// Generation is the generation (or member epoch) of the commit; -1 when none.
	Generation int32
}

// StreamPartitionResult is the outcome for one partition of a stream: Err is nil,
// streams.ErrPartitionNotFound (no such stream or partition), streams.ErrOffsetOutOfRange
// (an offset outside [0, log end]), ErrUnknownMember (the group id is a native group
// with live members on that stream) or, for OffsetDelete, ErrGroupSubscribed.
type StreamPartitionResult struct {
	Stream    string
	Partition int32
	Err       error
}

// ClassicCommit is an OffsetCommit request. A member commits with its MemberID and
// Generation; an admin (or a consumer without a group) with no MemberID and a
// negative Generation, accepted only while the group has no members.
type ClassicCommit struct {
	Group      string
	MemberID   string
	InstanceID string
	Generation int32
	Offsets    []StreamOffset
}

// CommitOffsets commits offsets, fenced by the generation: refused as a whole
// (nothing written) with ErrIllegalGeneration, ErrUnknownMember, ErrInstanceFenced or
// ErrRebalanceInProgress (between JoinGroup and SyncGroup) as Kafka does; otherwise
// each partition is committed or refused on its own (the results, in the order of
// req.Offsets). A partition's metadata over MaxOffsetMetadata is
// ErrOffsetMetadataTooLarge for it, not written. A new generation cannot form while
// the commit is written.
func (c *Classic) CommitOffsets(ctx context.Context, req *ClassicCommit) ([]StreamPartitionResult, error) {
	n := len(req.Offsets)
	out := make([]StreamPartitionResult, n)
	keep := make([]int, 0, n) // the entries sent to SQL, by their position in req.Offsets
	names, parts, offs, metas := make([]string, 0, n), make([]int32, 0, n), make([]int64, 0, n), make([]*string, 0, n)
	for i, o := range req.Offsets {
		out[i].Stream, out[i].Partition = o.Stream, o.Partition
		if l := utf16Len(o.Metadata); l > MaxOffsetMetadata {
			out[i].Err = fmt.Errorf("%s/%d: metadata of %d characters, over %d: %w",
				o.Stream, o.Partition, l, MaxOffsetMetadata, ErrOffsetMetadataTooLarge)
			continue
		}
		keep = append(keep, i)
		names, parts = append(names, o.Stream), append(parts, o.Partition)
		offs, metas = append(offs, o.Offset), append(metas, nullable(o.Metadata))
	}
	rows, err := c.pool.Query(ctx, `SELECT entry, outcome FROM streamd.kafka_group_commit(
		$1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		req.Group, req.MemberID, nullable(req.InstanceID), req.Generation, names, parts, offs, metas, c.now())
	if err != nil {
		return nil, fmt.Errorf("commit offsets of group %s as %s (generation %d): %w", req.Group, req.MemberID, req.Generation, sqlerr.Wrap(err))
	}
	res, err := partitionResults(rows, req.Group, names, parts)
	if err != nil {
		return nil, fmt.Errorf("commit offsets of group %s as %s (generation %d): %w", req.Group, req.MemberID, req.Generation, err)
	}
	for j, i := range keep {
		out[i] = res[j]
	}
	return out, nil
}

// MaxOffsetMetadata is the longest metadata an offset commit keeps, in UTF-16 code
// units as Kafka counts it (Java's String.length against offset.metadata.max.bytes,
// whose default is 4096).
const MaxOffsetMetadata = 4096

// ErrOffsetMetadataTooLarge: a committed offset's metadata is over
// MaxOffsetMetadata (Kafka's OFFSET_METADATA_TOO_LARGE); that offset is not written.
var ErrOffsetMetadataTooLarge = errors.New("offset metadata too large")

// utf16Len is the length of s in UTF-16 code units (Java's String.length).
func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		n++
		if r >= 0x10000 {
			n++
		}
	}
	return n
}

// FetchOffsets returns the group's committed offsets on the given streams (every
// stream when streams is nil), ascending by stream and partition; partitions without a
// commit are left out. The group need not be a classic one: native groups' offsets are
// the same rows.
func (c *Classic) FetchOffsets(ctx context.Context, group string, streamNames []string) ([]StreamOffset, error) {
	rows, err := c.pool.Query(ctx, `SELECT co.stream_name, co.partition, co."offset", coalesce(co.metadata, ''),
		coalesce(co.member_epoch, -1)::integer
		FROM streamd.consumer_offsets co
		WHERE co.group_id = $1 AND ($2::text[] IS NULL OR co.stream_name = ANY ($2))
		ORDER BY co.stream_name, co.partition`, group, streamNames)
	if err != nil {
		return nil, fmt.Errorf("fetch offsets of group %s: %w", group, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StreamOffset, error) {
		var o StreamOffset
		err := r.Scan(&o.Stream, &o.Partition, &o.Offset, &o.Metadata, &o.Generation)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("fetch offsets of group %s: %w", group, err)
	}
	return out, nil
}

// partitionResults turns the (entry, outcome) rows of the commit and offset-delete
// functions into one result per requested partition, in the request's order.
func partitionResults(rows pgx.Rows, group string, names []string, parts []int32) ([]StreamPartitionResult, error) {
	out := make([]StreamPartitionResult, len(names))
	for i := range names {
		out[i].Stream, out[i].Partition = names[i], parts[i]
	}
	var (
		entry   int
		outcome string
	)
	_, err := pgx.ForEachRow(rows, []any{&entry, &outcome}, func() error {
		if entry < 1 || entry > len(out) {
			return fmt.Errorf("result for entry %d of %d", entry, len(out))
		}
		res := &out[entry-1]
		where := fmt.Sprintf("%s/%d", res.Stream, res.Partition)
		switch outcome {
		case "ok":
		case "unknown_partition":
			res.Err = fmt.Errorf("%s: %w", where, streams.ErrPartitionNotFound)
		case "offset_out_of_range":
			res.Err = fmt.Errorf("%s: an offset outside [0, log end]: %w", where, streams.ErrOffsetOutOfRange)
		case "unknown_member":
			res.Err = fmt.Errorf("%s: group %s has live streamd members on this stream: %w", where, group, ErrUnknownMember)
		case "fenced_epoch":
			res.Err = fmt.Errorf("%s: the member of group %s has another member epoch: %w", where, group, ErrFenced)
		case "stale_epoch":
			res.Err = fmt.Errorf("%s: group %s: the member does not own the partition at this epoch: %w", where, group, ErrStaleMemberEpoch)
		case "subscribed":
			res.Err = fmt.Errorf("%s: group %s has live members consuming this stream: %w", where, group, ErrGroupSubscribed)
		default:
			return fmt.Errorf("%s: unexpected outcome %q", where, outcome)
		}
		return nil
	})
	if err != nil {
		return nil, sqlerr.Wrap(err)
	}
	return out, nil
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:4]) + "-" + hex.EncodeToString(b[4:6]) + "-" + hex.EncodeToString(b[6:8]) + "-" +
		hex.EncodeToString(b[8:10]) + "-" + hex.EncodeToString(b[10:])
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
