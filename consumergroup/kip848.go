package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/sqlerr"
)

// This file serves Kafka's KIP-848 consumer protocol (ConsumerGroupHeartbeat) on the
// native group machinery: a KIP-848 member is a member of the stream's native group
// (join_group, group_heartbeat, release_partitions, leave_group), assigned by the same
// server-side sticky assignor and fenced by the same member epoch, so native Go
// members and KIP-848 members may share a group. The member epoch is the native one:
// it is fixed for a membership (every join gets a new one), and assignment changes
// travel in the assignment, not in the epoch.
//
// Limitation: a KIP-848 member subscribes to one stream (a native membership is per
// stream, with an epoch of its own); a subscription of several topics is refused with
// ErrInvalidArgument.

// ErrStaleMemberEpoch: a KIP-848 member committed a partition it does not own at its
// epoch (Kafka's STALE_MEMBER_EPOCH): it was revoked; nothing of it was written.
var ErrStaleMemberEpoch = errors.New("stale member epoch")

// ConsumerHeartbeat is a KIP-848 ConsumerGroupHeartbeat.
type ConsumerHeartbeat struct {
	Group string
	// MemberID is chosen by the client (v1+).
	MemberID   string
	InstanceID string
	// MemberEpoch: 0 joins, -1 leaves, -2 leaves a static member (which keeps its
	// partitions until its session times out), a positive epoch heartbeats.
	MemberEpoch int32
	// RebalanceTimeout for a join; 0 means 60s.
	RebalanceTimeout time.Duration
	// Topics is the subscription (required to join; nil afterwards means unchanged).
	Topics []string
	// Owned is what the member owns now, when it said (OwnedKnown): partitions it
	// was asked to revoke and no longer owns are handed over to their next owner.
	Owned      []StreamPartition
	OwnedKnown bool
}

// ConsumerHeartbeatResult is the member's epoch and its assignment: the partitions it
// may own now (those it must revoke are left out; those waiting for their previous
// owner to revoke them come later).
type ConsumerHeartbeatResult struct {
	MemberID    string
	MemberEpoch int32
	Assignment  []StreamPartition
}

// ConsumerHeartbeat joins, heartbeats or leaves a KIP-848 member, with the session
// timeout cfg.ConsumerSessionTimeout. Errors: ErrFenced (the member is not a live
// member at its epoch: it rejoins with epoch 0), ErrUnknownMember,
// ErrInconsistentGroupProtocol (the group id is a classic group), ErrInvalidArgument,
// streams.ErrStreamNotFound, ErrInvalidGroupID.
func (c *Classic) ConsumerHeartbeat(ctx context.Context, req *ConsumerHeartbeat) (*ConsumerHeartbeatResult, error) {
	if req.MemberID == "" {
		return nil, fmt.Errorf("consumer heartbeat in group %s: a member id is required: %w", req.Group, ErrInvalidArgument)
	}
	if req.Topics != nil && len(req.Topics) != 1 {
		return nil, fmt.Errorf("consumer heartbeat in group %s: subscribe to exactly one topic (got %d): %w",
			req.Group, len(req.Topics), ErrInvalidArgument)
	}
	// The member's current membership, if any.
	var (
		stream string
		epoch  int64
	)
	err := c.pool.QueryRow(ctx, `SELECT stream_name, member_epoch FROM streamd.consumer_registrations
		WHERE group_id = $1 AND consumer_id = $2 ORDER BY registered_at DESC LIMIT 1`, req.Group, req.MemberID).Scan(&stream, &epoch)
	known := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("consumer heartbeat in group %s: %w", req.Group, err)
	}
	res := &ConsumerHeartbeatResult{MemberID: req.MemberID}
	switch {
	case req.MemberEpoch == -2:
		res.MemberEpoch = -2
		return res, nil
	case req.MemberEpoch == -1:
		res.MemberEpoch = -1
		if known {
			if _, err := c.pool.Exec(ctx, "SELECT streamd.leave_group($1, $2, $3, $4, $5)", stream, req.Group, req.MemberID, epoch, c.now()); err != nil {
				return nil, fmt.Errorf("consumer leave %s from group %s: %w", req.MemberID, req.Group, sqlerr.Wrap(err))
			}
		}
		return res, nil
	case req.MemberEpoch == 0:
		if len(req.Topics) != 1 {
			return nil, fmt.Errorf("consumer join %s to group %s: subscribe to exactly one topic: %w", req.MemberID, req.Group, ErrInvalidArgument)
		}
		if known {
			// A rejoin under the same id after a fence: the old membership goes first.
			if _, err := c.pool.Exec(ctx, "SELECT streamd.leave_group($1, $2, $3, $4, $5)", stream, req.Group, req.MemberID, epoch, c.now()); err != nil {
				return nil, fmt.Errorf("consumer join %s to group %s: %w", req.MemberID, req.Group, sqlerr.Wrap(err))
			}
		}
		rebalance := req.RebalanceTimeout
		if rebalance <= 0 {
			rebalance = time.Minute
		}
		m, err := memberJoin(ctx, c.pool, req.Topics[0], req.Group, req.MemberID, req.InstanceID,
			c.cfg.ConsumerSessionTimeout, rebalance, c.now())
		if err != nil {
			return nil, err
		}
		stream, epoch = m.stream, m.epoch
	default:
		if !known {
			return nil, fmt.Errorf("consumer heartbeat %s in group %s: %w", req.MemberID, req.Group, ErrUnknownMember)
		}
		if int64(req.MemberEpoch) != epoch {
			return nil, fmt.Errorf("consumer heartbeat %s in group %s: epoch %d, the member's is %d: %w",
				req.MemberID, req.Group, req.MemberEpoch, epoch, ErrFenced)
		}
		if req.Topics != nil && req.Topics[0] != stream {
			return nil, fmt.Errorf("consumer heartbeat %s in group %s: a member cannot change its topic (%s to %s); rejoin: %w",
				req.MemberID, req.Group, stream, req.Topics[0], ErrInvalidArgument)
		}
	}
	m := &member{stream: stream, group: req.Group, consumerID: req.MemberID, instanceID: req.InstanceID, epoch: epoch}
	a, err := m.heartbeat(ctx, c.pool, c.now())
	if err != nil {
		return nil, err
	}
	if req.OwnedKnown && len(a.Revoking) > 0 {
		owned := map[int32]bool{}
		for _, p := range req.Owned {
			if p.Stream == stream {
				owned[p.Partition] = true
			}
		}
		var released []int32
		for _, p := range a.Revoking {
			if !owned[p] {
				released = append(released, p)
			}
		}
		if len(released) > 0 {
			if err := m.release(ctx, c.pool, released, c.now()); err != nil {
				return nil, err
			}
			if a, err = m.heartbeat(ctx, c.pool, c.now()); err != nil {
				return nil, err
			}
		}
	}
	res.MemberEpoch = int32(epoch)
	res.Assignment = []StreamPartition{}
	for _, p := range a.Assigned {
		if !slices.Contains(a.Revoking, p) {
			res.Assignment = append(res.Assignment, StreamPartition{Stream: stream, Partition: p})
		}
	}
	return res, nil
}

// ConsumerGroupMember is a member of a streamd group (native Go or KIP-848) across the
// streams it consumes, as ConsumerGroupDescribe reports it.
type ConsumerGroupMember struct {
	MemberID   string
	InstanceID string
	// MemberEpoch is the member's epoch on its first stream (one per stream).
	MemberEpoch int64
	Streams     []string
	// Assigned are the partitions it owns; Target those the assignor gives it (owned
	// ones being revoked left out, pending ones added).
	Assigned []StreamPartition
	Target   []StreamPartition
}

// ConsumerGroupDescription is a streamd group id across streams: its largest group
// epoch, its state (Empty, Stable, or Reconciling while partitions move) and its live
// members.
type ConsumerGroupDescription struct {
	Group   string
	State   string
	Epoch   int64
	Members []ConsumerGroupMember
}

// DescribeConsumerGroup describes a streamd group id (Kafka's ConsumerGroupDescribe).
// ErrGroupNotFound when no stream has a group of that id, or when it is a classic
// group (Kafka answers GROUP_ID_NOT_FOUND for a group of the other protocol).
func (c *Classic) DescribeConsumerGroup(ctx context.Context, group string) (*ConsumerGroupDescription, error) {
	d := ConsumerGroupDescription{Group: group}
	var epoch *int64
	var classic bool
	err := c.pool.QueryRow(ctx, `SELECT max(group_epoch), EXISTS (SELECT 1 FROM streamd.kafka_groups WHERE group_id = $1)
		FROM streamd.consumer_groups WHERE group_id = $1`, group).Scan(&epoch, &classic)
	if err != nil {
		return nil, fmt.Errorf("describe consumer group %s: %w", group, err)
	}
	if epoch == nil || classic {
		return nil, fmt.Errorf("describe consumer group %s: %w", group, ErrGroupNotFound)
	}
	d.Epoch = *epoch
	rows, err := c.pool.Query(ctx, `SELECT cr.consumer_id, coalesce(cr.instance_id, ''), cr.member_epoch, cr.stream_name,
		coalesce((SELECT array_agg(cp.partition ORDER BY cp.partition) FROM streamd.consumer_partitions cp
		           WHERE cp.stream_name = cr.stream_name AND cp.group_id = cr.group_id AND cp.owner_id = cr.consumer_id), '{}'),
		coalesce((SELECT array_agg(cp.partition ORDER BY cp.partition) FROM streamd.consumer_partitions cp
		           WHERE cp.stream_name = cr.stream_name AND cp.group_id = cr.group_id
		             AND coalesce(cp.target_id, cp.owner_id) = cr.consumer_id), '{}')
		FROM streamd.consumer_registrations cr
		WHERE cr.group_id = $1 AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= now()
		ORDER BY cr.consumer_id, cr.registered_at, cr.stream_name`, group)
	if err != nil {
		return nil, fmt.Errorf("describe consumer group %s: %w", group, err)
	}
	var (
		id, instance, stream string
		memberEpoch          int64
		assigned, target     []int32
	)
	d.State = "Empty"
	_, err = pgx.ForEachRow(rows, []any{&id, &instance, &memberEpoch, &stream, &assigned, &target}, func() error {
		if n := len(d.Members); n == 0 || d.Members[n-1].MemberID != id {
			d.Members = append(d.Members, ConsumerGroupMember{MemberID: id, InstanceID: instance, MemberEpoch: memberEpoch})
		}
		m := &d.Members[len(d.Members)-1]
		m.Streams = append(m.Streams, stream)
		for _, p := range assigned {
			m.Assigned = append(m.Assigned, StreamPartition{Stream: stream, Partition: p})
		}
		for _, p := range target {
			m.Target = append(m.Target, StreamPartition{Stream: stream, Partition: p})
		}
		if !slices.Equal(assigned, target) {
			d.State = "Reconciling"
		} else if d.State == "Empty" {
			d.State = "Stable"
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("describe consumer group %s: %w", group, err)
	}
	return &d, nil
}
