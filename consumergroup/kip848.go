package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/streamd/streamd/internal/sqlerr"
	"github.com/streamd/streamd/streams"
)

// This file serves Kafka's KIP-848 consumer protocol (ConsumerGroupHeartbeat) on the
// native group machinery. A KIP-848 member is a row of streamd.kafka_consumer_members
// (sql/functions/0225_kafka_consumer_members.sql): its Kafka member epoch, fixed for a
// membership (every join gets a new one from the group's counter), and its
// subscription, topic names and/or a regex. It consumes each stream its subscription
// resolves to through a native membership of that stream's group under the same id
// (join_group, group_heartbeat, release_partitions, leave_group), assigned by the same
// server-side sticky assignor and fenced by that membership's native epoch, so native
// Go members and KIP-848 members share a stream's group. Every heartbeat reconciles the
// member's memberships with its subscription: a stream created later that a name or
// the regex matches is joined then, one that left the subscription (or was deleted) is
// left. The resolution itself is cached until the subscription or the stream set
// changes (kip848_cache.go). Assignment changes travel in the assignment, not in the
// epoch.

// ErrStaleMemberEpoch: a KIP-848 member committed a partition it does not own at its
// epoch (Kafka's STALE_MEMBER_EPOCH): it was revoked; nothing of it was written.
var ErrStaleMemberEpoch = errors.New("stale member epoch")

// ErrInvalidRegularExpression: a KIP-848 subscription's regex does not compile as RE2
// (Kafka's INVALID_REGULAR_EXPRESSION). Nothing was written.
var ErrInvalidRegularExpression = errors.New("invalid regular expression")

// kip848LockClass is the first key of the session advisory lock that serializes one
// KIP-848 member's heartbeats (the second is hashtext of group/member);
// kip848InstanceLockClass that of the lock that serializes the calls of the members
// holding one static instance id (hashtext of group/instance id), taken second.
const (
	kip848LockClass         = 1396986180
	kip848InstanceLockClass = 1396986181
)

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
	// Topics are the subscribed topic names (nil after the join means unchanged).
	// A name of a stream that does not exist is kept: the stream is joined once it
	// exists.
	Topics []string
	// Regex is the subscribed regex (RE2, matched against whole stream names, as
	// Kafka's); nil means unchanged, "" removes it. A join needs Topics or a Regex.
	Regex *string
	// Allowed, when not nil, filters the streams the subscription resolves to: only
	// those it returns are joined (the Kafka listener keeps the topics the principal
	// may read).
	Allowed func(ctx context.Context, streams []string) ([]string, error)
	// Virtual are topics that are not streams but that a subscription may name or
	// match (the Kafka listener's internal topic), with their partition counts. Each of
	// their partitions goes to one of the group's live KIP-848 members whose
	// subscription takes the topic in (partition i to the (i mod n)-th of the n, by
	// member id), with no handover: they hold no records.
	Virtual map[string]int32
	// Owned is what the member owns now, when it said (OwnedKnown): partitions it
	// was asked to revoke and no longer owns are handed over to their next owner.
	Owned      []StreamPartition
	OwnedKnown bool
}

// ConsumerHeartbeatResult is the member's epoch and its assignment across its streams:
// the partitions it may own now (those it must revoke are left out; those waiting for
// their previous owner to revoke them come later).
type ConsumerHeartbeatResult struct {
	MemberID    string
	MemberEpoch int32
	Assignment  []StreamPartition
}

// ConsumerHeartbeat joins, heartbeats or leaves a KIP-848 member, with the session
// timeout cfg.ConsumerSessionTimeout. Errors: ErrFenced (the member is at another
// epoch: it rejoins with epoch 0), ErrUnknownMember (no such live member),
// ErrInconsistentGroupProtocol (the group id is a classic group), ErrInvalidArgument,
// ErrInvalidRegularExpression, ErrInvalidGroupID.
func (c *Classic) ConsumerHeartbeat(ctx context.Context, req *ConsumerHeartbeat) (*ConsumerHeartbeatResult, error) {
	if req.MemberID == "" {
		return nil, fmt.Errorf("consumer heartbeat in group %s: a member id is required: %w", req.Group, ErrInvalidArgument)
	}
	if req.Regex != nil && *req.Regex != "" {
		if _, err := c.subs.compile(*req.Regex); err != nil {
			return nil, fmt.Errorf("consumer heartbeat %s in group %s: %w", req.MemberID, req.Group, err)
		}
	}
	// The member's calls are serialized across instances (a leave racing a heartbeat
	// that joins a stream would leave a membership behind, two heartbeats joining one
	// stream would collide), on one connection that holds a session advisory lock of
	// the member; each statement still commits on its own.
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("consumer heartbeat %s in group %s: %w", req.MemberID, req.Group, err)
	}
	defer conn.Release()
	unlock, err := lockConsumerMember(ctx, conn, req)
	if err != nil {
		return nil, fmt.Errorf("consumer heartbeat %s in group %s: %w", req.MemberID, req.Group, err)
	}
	defer unlock()
	var db streams.DBTX = conn
	res := &ConsumerHeartbeatResult{MemberID: req.MemberID}
	var (
		topics    []string
		regex     *string
		rebalance = req.RebalanceTimeout
		sub       subscriptionState
	)
	switch {
	case req.MemberEpoch == -2:
		res.MemberEpoch = -2
		return res, nil
	case req.MemberEpoch == -1:
		res.MemberEpoch = -1
		if err := c.consumerLeave(ctx, db, req.Group, req.MemberID); err != nil {
			return nil, err
		}
		return res, nil
	case req.MemberEpoch == 0:
		if len(req.Topics) == 0 && (req.Regex == nil || *req.Regex == "") {
			return nil, fmt.Errorf("consumer join %s to group %s: subscribe to a topic or a regex: %w", req.MemberID, req.Group, ErrInvalidArgument)
		}
		// A rejoin under the same id after a fence: the old memberships go first.
		if err := c.consumerLeave(ctx, db, req.Group, req.MemberID); err != nil {
			return nil, err
		}
		if rebalance <= 0 {
			rebalance = time.Minute
		}
		// The stream set's version is read in the same statement (at its start: a
		// version no later than the stream names resolved after it).
		err := db.QueryRow(ctx, `SELECT streamd.kafka_consumer_join($1, $2, $3, $4, $5, $6, $7, $8),
			(SELECT v.version FROM streamd.stream_set_version v)`,
			req.Group, req.MemberID, nullable(req.InstanceID), nonNilStrings(req.Topics), req.Regex,
			c.cfg.ConsumerSessionTimeout.Milliseconds(), rebalance.Milliseconds(), c.now()).Scan(&res.MemberEpoch, &sub.version)
		if err != nil {
			return nil, fmt.Errorf("consumer join %s to group %s: %w", req.MemberID, req.Group, sqlerr.Wrap(err))
		}
		topics, regex = req.Topics, req.Regex
		if regex != nil && *regex == "" {
			regex = nil
		}
	default:
		var (
			instance  *string
			rebalMs   int32
			storedRe  *string
			newTopics []string
		)
		if req.Topics != nil {
			newTopics = req.Topics
		}
		err := db.QueryRow(ctx, `SELECT subscribed_topics, subscribed_regex, instance_id, rebalance_timeout_ms, virtual_topics,
			(SELECT v.version FROM streamd.stream_set_version v)
			FROM streamd.kafka_consumer_heartbeat($1, $2, $3, $4, $5, $6)`,
			req.Group, req.MemberID, req.MemberEpoch, newTopics, req.Regex, c.now()).Scan(&topics, &storedRe, &instance, &rebalMs,
			&sub.virtual, &sub.version)
		switch err := sqlerr.Wrap(err); {
		case errors.Is(err, ErrUnknownMember):
			// Its session lapsed: what is left of its memberships goes too.
			if lerr := c.consumerLeave(ctx, db, req.Group, req.MemberID); lerr != nil {
				return nil, lerr
			}
			return nil, fmt.Errorf("consumer heartbeat %s in group %s: %w", req.MemberID, req.Group, err)
		case err != nil:
			return nil, fmt.Errorf("consumer heartbeat %s in group %s: %w", req.MemberID, req.Group, err)
		}
		res.MemberEpoch, regex, rebalance = req.MemberEpoch, storedRe, time.Duration(rebalMs)*time.Millisecond
		req = withInstance(req, deref(instance))
	}
	sub.epoch = res.MemberEpoch
	assigned, err := c.consumerReconcile(ctx, db, req, topics, regex, rebalance, sub)
	if err != nil {
		return nil, err
	}
	res.Assignment = assigned
	return res, nil
}

// lockConsumerMember takes, on conn, the session advisory lock of the member, then,
// for a static member, that of its instance id: the join's (req.InstanceID) or, for
// any other call, the one its row holds. The second lock serializes a replaced static
// member with the member that replaces it: without it, the old member's heartbeat,
// validated just before the new member's join deleted its row, went on to find its
// native memberships taken over by instance id and joined those streams again, taking
// them back. With it the join waits for that heartbeat to end, and the old member's
// next call finds its row gone (UNKNOWN_MEMBER_ID) and leaves what it still holds. Both
// locks are always taken in this order (member, then instance), so no two calls wait
// for each other. The returned func releases them (a lock that cannot be released goes
// with its session: the connection is closed).
func lockConsumerMember(ctx context.Context, conn *pgxpool.Conn, req *ConsumerHeartbeat) (func(), error) {
	memberKey := req.Group + "/" + req.MemberID
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1, hashtext($2))", kip848LockClass, memberKey); err != nil {
		return nil, err
	}
	instanceKey := ""
	release := func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1, hashtext($2)),
			CASE WHEN $3 <> '' THEN pg_advisory_unlock($4, hashtext($3)) END`,
			kip848LockClass, memberKey, instanceKey, kip848InstanceLockClass)
		if err != nil {
			_ = conn.Conn().Close(uctx)
		}
	}
	var err error
	if req.MemberEpoch == 0 {
		if req.InstanceID != "" {
			instanceKey = req.Group + "/" + req.InstanceID
			_, err = conn.Exec(ctx, "SELECT pg_advisory_lock($1, hashtext($2))", kip848InstanceLockClass, instanceKey)
		}
	} else {
		// The row's instance id is read after the member lock: a join of this member id
		// (which may set it) has ended.
		var instance *string
		err = conn.QueryRow(ctx, `SELECT m.instance_id, pg_advisory_lock($3, hashtext($1 || '/' || m.instance_id))
			FROM streamd.kafka_consumer_members m
			WHERE m.group_id = $1 AND m.member_id = $2 AND m.instance_id IS NOT NULL`,
			req.Group, req.MemberID, kip848InstanceLockClass).Scan(&instance, nil)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			err = nil
		case err == nil:
			instanceKey = req.Group + "/" + *instance
		}
	}
	if err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// subscriptionState is what a call read with the member's row: its Kafka epoch, the
// stream set's version and the virtual topics recorded for it.
type subscriptionState struct {
	epoch   int32
	version int64
	virtual []string
}

func withInstance(req *ConsumerHeartbeat, instance string) *ConsumerHeartbeat {
	r := *req
	r.InstanceID = instance
	return &r
}

// compileSubscription compiles a KIP-848 regex as Kafka applies it: to whole names.
func compileSubscription(re string) (*regexp.Regexp, error) {
	rx, err := regexp.Compile("^(?:" + re + ")$")
	if err != nil {
		return nil, fmt.Errorf("regex %q: %v: %w", re, err, ErrInvalidRegularExpression)
	}
	return rx, nil
}

// consumerStreams resolves a subscription to the existing streams it names or its
// regex matches, ascending, filtered by allowed. The resolution before allowed is
// cached for the stream set's version: it reads streamd.streams only when the
// subscription or the set of streams changed since this process last resolved it.
func (c *Classic) consumerStreams(ctx context.Context, db streams.DBTX, topics []string, regex *string, version int64,
	allowed func(context.Context, []string) ([]string, error)) ([]string, error) {
	var rx *regexp.Regexp
	if regex != nil && *regex != "" {
		var err error
		if rx, err = c.subs.compile(*regex); err != nil {
			return nil, err
		}
	} else {
		regex = nil
	}
	key := subscriptionKey(topics, regex)
	cached, ok := c.subs.resolved.get(key)
	if !ok || cached.version != version {
		c.subs.resolves.Add(1)
		rows, err := db.Query(ctx, `SELECT stream_name FROM streamd.streams
			WHERE stream_name = ANY ($1) OR $2 ORDER BY stream_name`, nonNilStrings(topics), rx != nil)
		if err != nil {
			return nil, fmt.Errorf("resolve subscription: %w", err)
		}
		all, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("resolve subscription: %w", err)
		}
		cached = resolvedSubscription{version: version, streams: make([]string, 0, len(all))}
		for _, s := range all {
			if slices.Contains(topics, s) || (rx != nil && rx.MatchString(s)) {
				cached.streams = append(cached.streams, s)
			}
		}
		c.subs.resolved.put(key, cached)
	}
	out := slices.Clone(cached.streams)
	if allowed != nil && len(out) > 0 {
		var err error
		if out, err = allowed(ctx, out); err != nil {
			return nil, fmt.Errorf("resolve subscription: %w", err)
		}
		slices.Sort(out)
	}
	return out, nil
}

// consumerMemberships returns the member's native memberships: stream to epoch.
func (c *Classic) consumerMemberships(ctx context.Context, db streams.DBTX, group, memberID string) (map[string]int64, error) {
	rows, err := db.Query(ctx, `SELECT stream_name, member_epoch FROM streamd.consumer_registrations
		WHERE group_id = $1 AND consumer_id = $2`, group, memberID)
	if err != nil {
		return nil, fmt.Errorf("memberships of %s in group %s: %w", memberID, group, err)
	}
	out := map[string]int64{}
	var (
		stream string
		epoch  int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&stream, &epoch}, func() error { out[stream] = epoch; return nil }); err != nil {
		return nil, fmt.Errorf("memberships of %s in group %s: %w", memberID, group, err)
	}
	return out, nil
}

func sortedStreams(ms map[string]int64) []string {
	out := make([]string, 0, len(ms))
	for s := range ms {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// consumerLeave removes a KIP-848 member: its native memberships (their partitions
// are handed over at once), then its row.
func (c *Classic) consumerLeave(ctx context.Context, db streams.DBTX, group, memberID string) error {
	ms, err := c.consumerMemberships(ctx, db, group, memberID)
	if err != nil {
		return err
	}
	for _, stream := range sortedStreams(ms) {
		m := &member{stream: stream, group: group, consumerID: memberID, epoch: ms[stream]}
		if _, err := m.leave(ctx, db, c.now()); err != nil {
			return fmt.Errorf("consumer leave %s from group %s: %w", memberID, group, err)
		}
	}
	if _, err := db.Exec(ctx, "SELECT streamd.kafka_consumer_leave($1, $2)", group, memberID); err != nil {
		return fmt.Errorf("consumer leave %s from group %s: %w", memberID, group, sqlerr.Wrap(err))
	}
	return nil
}

// consumerReconcile makes the member's native memberships those of its subscription
// (joining the streams it resolves to now, leaving the others), heartbeats each, hands
// over what the member reported it let go, and returns its assignment.
func (c *Classic) consumerReconcile(ctx context.Context, db streams.DBTX, req *ConsumerHeartbeat, topics []string, regex *string,
	rebalance time.Duration, sub subscriptionState) ([]StreamPartition, error) {
	want, err := c.consumerStreams(ctx, db, topics, regex, sub.version, req.Allowed)
	if err != nil {
		return nil, fmt.Errorf("consumer heartbeat %s in group %s: %w", req.MemberID, req.Group, err)
	}
	have, err := c.consumerMemberships(ctx, db, req.Group, req.MemberID)
	if err != nil {
		return nil, err
	}
	for _, stream := range sortedStreams(have) {
		if slices.Contains(want, stream) {
			continue
		}
		m := &member{stream: stream, group: req.Group, consumerID: req.MemberID, epoch: have[stream]}
		if _, err := m.leave(ctx, db, c.now()); err != nil {
			return nil, fmt.Errorf("consumer heartbeat %s in group %s: %w", req.MemberID, req.Group, err)
		}
	}
	owned := map[StreamPartition]bool{}
	for _, p := range req.Owned {
		owned[p] = true
	}
	assignment := []StreamPartition{}
	for _, stream := range want {
		a, err := c.consumerStream(ctx, db, req, stream, have, rebalance)
		if errors.Is(err, streams.ErrStreamNotFound) {
			continue // deleted since it was resolved
		}
		if err != nil {
			return nil, err
		}
		if req.OwnedKnown && len(a.Revoking) > 0 {
			var released []int32
			for _, p := range a.Revoking {
				if !owned[StreamPartition{Stream: stream, Partition: p}] {
					released = append(released, p)
				}
			}
			if len(released) > 0 {
				m := &member{stream: stream, group: req.Group, consumerID: req.MemberID, epoch: a.epoch}
				if err := m.release(ctx, db, released, c.now()); err != nil {
					return nil, err
				}
				if a.Assignment, err = m.heartbeat(ctx, db, c.now()); err != nil {
					return nil, err
				}
			}
		}
		for _, p := range a.Assigned {
			if !slices.Contains(a.Revoking, p) {
				assignment = append(assignment, StreamPartition{Stream: stream, Partition: p})
			}
		}
	}
	virtual, err := c.consumerVirtual(ctx, db, req, topics, regex, sub)
	if err != nil {
		return nil, err
	}
	return append(assignment, virtual...), nil
}

// takesTopic reports whether a subscription names or matches a topic.
func (c *Classic) takesTopic(topics []string, regex *string, name string) bool {
	if slices.Contains(topics, name) {
		return true
	}
	if regex == nil || *regex == "" {
		return false
	}
	rx, err := c.subs.compile(*regex)
	return err == nil && rx.MatchString(name)
}

// consumerVirtual is the member's share of the virtual topics its subscription takes
// in (ConsumerHeartbeat.Virtual). The member records which ones those are in its row
// when they changed (sub.virtual is what the row held), and its rank among the live
// members whose rows name a topic is counted in SQL: the other members'
// subscriptions are neither read nor compiled.
func (c *Classic) consumerVirtual(ctx context.Context, db streams.DBTX, req *ConsumerHeartbeat, topics []string, regex *string,
	sub subscriptionState) ([]StreamPartition, error) {
	mine := []string{}
	for name := range req.Virtual {
		if c.takesTopic(topics, regex, name) {
			mine = append(mine, name)
		}
	}
	slices.Sort(mine)
	if !slices.Equal(mine, nonNilStrings(sub.virtual)) {
		var ok bool
		if err := db.QueryRow(ctx, "SELECT streamd.kafka_consumer_set_virtual($1, $2, $3, $4)",
			req.Group, req.MemberID, sub.epoch, mine).Scan(&ok); err != nil {
			return nil, fmt.Errorf("virtual topics of %s in group %s: %w", req.MemberID, req.Group, err)
		}
	}
	if len(mine) == 0 {
		return nil, nil
	}
	rows, err := db.Query(ctx, "SELECT topic, taker, rank, takers FROM streamd.kafka_consumer_virtual_ranks($1, $2, $3, $4)",
		req.Group, req.MemberID, mine, c.now())
	if err != nil {
		return nil, fmt.Errorf("members of group %s: %w", req.Group, err)
	}
	var (
		out          []StreamPartition
		name         string
		taker        bool
		rank, takers int32
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &taker, &rank, &takers}, func() error {
		if !taker { // its row changed meanwhile
			return nil
		}
		for p := int32(0); p < req.Virtual[name]; p++ {
			if p%takers == rank {
				out = append(out, StreamPartition{Stream: name, Partition: p})
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("members of group %s: %w", req.Group, err)
	}
	return out, nil
}

// epochAssignment is a native membership's assignment with its epoch.
type epochAssignment struct {
	Assignment
	epoch int64
}

// consumerStream heartbeats the member's native membership of a stream, joining it
// first when it has none; a membership fenced there (taken over or expelled while the
// Kafka member lived) is joined again: the partitions it lost are not in its new
// assignment, and its commits of them are refused at the new native epoch.
func (c *Classic) consumerStream(ctx context.Context, db streams.DBTX, req *ConsumerHeartbeat, stream string, have map[string]int64,
	rebalance time.Duration) (epochAssignment, error) {
	epoch, ok := have[stream]
	for attempt := 0; ; attempt++ {
		if !ok {
			m, err := memberJoin(ctx, db, stream, req.Group, req.MemberID, req.InstanceID,
				c.cfg.ConsumerSessionTimeout, rebalance, c.now())
			if err != nil {
				return epochAssignment{}, err
			}
			epoch = m.epoch
		}
		m := &member{stream: stream, group: req.Group, consumerID: req.MemberID, instanceID: req.InstanceID, epoch: epoch}
		a, err := m.heartbeat(ctx, db, c.now())
		if errors.Is(err, ErrFenced) && ok && attempt == 0 {
			if _, err := m.leave(ctx, db, c.now()); err != nil {
				return epochAssignment{}, err
			}
			ok = false
			continue
		}
		if err != nil {
			return epochAssignment{}, err
		}
		return epochAssignment{Assignment: a, epoch: epoch}, nil
	}
}

// ConsumerGroupMember is a member of a streamd group (native Go or KIP-848) across the
// streams it consumes, as ConsumerGroupDescribe reports it.
type ConsumerGroupMember struct {
	MemberID   string
	InstanceID string
	// MemberEpoch is a KIP-848 member's Kafka member epoch; a native member's epoch
	// on its first stream (native members have one per stream).
	MemberEpoch int64
	// Regex is a KIP-848 member's subscribed regex ("" when none).
	Regex string
	// Streams are the streams it consumes (for a KIP-848 member, its subscription
	// resolved).
	Streams []string
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
	// A KIP-848 group is a group from its first join, before it consumes a stream.
	err := c.pool.QueryRow(ctx, `SELECT CASE WHEN EXISTS (SELECT 1 FROM streamd.kafka_consumer_groups kc WHERE kc.group_id = $1)
		       THEN coalesce(max(group_epoch), 0) ELSE max(group_epoch) END,
		       EXISTS (SELECT 1 FROM streamd.kafka_groups WHERE group_id = $1)
		FROM streamd.consumer_groups WHERE group_id = $1`, group).Scan(&epoch, &classic)
	if err != nil {
		return nil, fmt.Errorf("describe consumer group %s: %w", group, err)
	}
	if epoch == nil || classic {
		return nil, fmt.Errorf("describe consumer group %s: %w", group, ErrGroupNotFound)
	}
	d.Epoch = *epoch
	rows, err := c.pool.Query(ctx, `SELECT cr.consumer_id, coalesce(cr.instance_id, ''),
		coalesce(km.member_epoch, cr.member_epoch), coalesce(km.subscribed_regex, ''), cr.stream_name,
		coalesce((SELECT array_agg(cp.partition ORDER BY cp.partition) FROM streamd.consumer_partitions cp
		           WHERE cp.stream_name = cr.stream_name AND cp.group_id = cr.group_id AND cp.owner_id = cr.consumer_id), '{}'),
		coalesce((SELECT array_agg(cp.partition ORDER BY cp.partition) FROM streamd.consumer_partitions cp
		           WHERE cp.stream_name = cr.stream_name AND cp.group_id = cr.group_id
		             AND coalesce(cp.target_id, cp.owner_id) = cr.consumer_id), '{}')
		FROM streamd.consumer_registrations cr
		LEFT JOIN streamd.kafka_consumer_members km ON km.group_id = cr.group_id AND km.member_id = cr.consumer_id
		WHERE cr.group_id = $1 AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= now()
		UNION ALL
		-- KIP-848 members whose subscription resolves to no stream: members all the same.
		SELECT km.member_id, coalesce(km.instance_id, ''), km.member_epoch, coalesce(km.subscribed_regex, ''), NULL,
		       '{}', '{}'
		FROM streamd.kafka_consumer_members km
		WHERE km.group_id = $1 AND km.last_heartbeat + km.session_timeout_ms * interval '1 millisecond' >= now()
		  AND NOT EXISTS (SELECT 1 FROM streamd.consumer_registrations cr
		                   WHERE cr.group_id = km.group_id AND cr.consumer_id = km.member_id
		                     AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= now())
		ORDER BY 1, 5 NULLS FIRST`, group)
	if err != nil {
		return nil, fmt.Errorf("describe consumer group %s: %w", group, err)
	}
	var (
		id, instance, regex string
		stream              *string
		memberEpoch         int64
		assigned, target    []int32
	)
	d.State = "Empty"
	_, err = pgx.ForEachRow(rows, []any{&id, &instance, &memberEpoch, &regex, &stream, &assigned, &target}, func() error {
		if n := len(d.Members); n == 0 || d.Members[n-1].MemberID != id {
			d.Members = append(d.Members, ConsumerGroupMember{MemberID: id, InstanceID: instance, MemberEpoch: memberEpoch, Regex: regex})
		}
		m := &d.Members[len(d.Members)-1]
		if stream == nil {
			if d.State == "Empty" {
				d.State = "Stable"
			}
			return nil
		}
		m.Streams = append(m.Streams, *stream)
		for _, p := range assigned {
			m.Assigned = append(m.Assigned, StreamPartition{Stream: *stream, Partition: p})
		}
		for _, p := range target {
			m.Target = append(m.Target, StreamPartition{Stream: *stream, Partition: p})
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
