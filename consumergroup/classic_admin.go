package consumergroup

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/streamd/streamd/internal/sqlerr"
)

// ErrGroupSubscribed: OffsetDelete refused a partition of a stream the group's live
// members consume (Kafka's GROUP_SUBSCRIBED_TO_TOPIC); nothing of it was deleted.
var ErrGroupSubscribed = errors.New("group subscribed to the stream")

// Kinds of group, as Kafka's ListGroups (v5+) reports them.
const (
	// GroupTypeClassic is a Kafka classic-protocol group (JoinGroup/SyncGroup).
	GroupTypeClassic = "classic"
	// GroupTypeConsumer is a streamd consumer group: native Go members and KIP-848
	// (ConsumerGroupHeartbeat) members, server-side assignment.
	GroupTypeConsumer = "consumer"
)

// KafkaGroup is a group as Kafka's ListGroups and DescribeGroups see it: every group id,
// across streams. A group id with classic state is a classic group; one that exists
// only as streamd groups of streams (consumergroup.Consumer, KIP-848 members, or
// offsets committed without a group) is a consumer group.
type KafkaGroup struct {
	Group string
	// Type is GroupTypeClassic or GroupTypeConsumer.
	Type string
	// State is Kafka's: Empty, PreparingRebalance, CompletingRebalance, Stable (Dead
	// from DescribeKafkaGroup for a group that does not exist).
	State        string
	ProtocolType string
	// Protocol is the classic group's assignor ("" otherwise).
	Protocol   string
	Generation int32
	Members    []KafkaGroupMember
}

// KafkaGroupMember is a member of a group in DescribeKafkaGroup. Metadata and
// Assignment are a classic member's bytes for the group's protocol (nil for streamd
// members).
type KafkaGroupMember struct {
	MemberID   string
	InstanceID string
	ClientID   string
	ClientHost string
	Metadata   []byte
	Assignment []byte
}

// ListKafkaGroups returns every group id (classic, those of streamd groups on any
// stream, and KIP-848 groups from their first join, before they consume a stream)
// with its type, state and protocol type, ascending by id; no members. Classic groups'
// dead members are removed first. A consumer group is Stable while it has a live
// member (native or KIP-848), else Empty; its generation is its streams' largest
// group epoch (0 before it consumes one).
func (c *Classic) ListKafkaGroups(ctx context.Context) ([]KafkaGroup, error) {
	if _, err := c.pool.Exec(ctx, "SELECT streamd.kafka_groups_maintain($1)", c.now()); err != nil {
		return nil, fmt.Errorf("list kafka groups: %w", sqlerr.Wrap(err))
	}
	rows, err := c.pool.Query(ctx, `
		SELECT g.group_id, 'classic', g.state, coalesce(g.protocol_type, ''), coalesce(g.protocol_name, ''), g.generation
		  FROM streamd.kafka_groups g
		UNION ALL
		SELECT n.group_id, 'consumer',
		       CASE WHEN bool_or(n.live) OR streamd.kc_has_live_members(n.group_id, now()) THEN 'Stable' ELSE 'Empty' END,
		       'consumer', '', coalesce(max(n.group_epoch), 0)::integer
		  FROM (SELECT cg.group_id, cg.group_epoch,
		               EXISTS (SELECT 1 FROM streamd.consumer_registrations cr
		                        WHERE cr.stream_name = cg.stream_name AND cr.group_id = cg.group_id
		                          AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= now()) AS live
		          FROM streamd.consumer_groups cg
		        UNION ALL
		        SELECT kc.group_id, NULL, false FROM streamd.kafka_consumer_groups kc) n
		 WHERE NOT EXISTS (SELECT 1 FROM streamd.kafka_groups g WHERE g.group_id = n.group_id)
		 GROUP BY n.group_id
		 ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("list kafka groups: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (KafkaGroup, error) {
		var g KafkaGroup
		err := r.Scan(&g.Group, &g.Type, &g.State, &g.ProtocolType, &g.Protocol, &g.Generation)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("list kafka groups: %w", err)
	}
	return out, nil
}

// DescribeKafkaGroup returns a group with its members, after removing those whose
// session expired. A group id that does not exist is State "Dead" with no members
// (Kafka's answer), not an error.
func (c *Classic) DescribeKafkaGroup(ctx context.Context, group string) (*KafkaGroup, error) {
	g := KafkaGroup{Group: group, Type: GroupTypeClassic, State: "Dead"}
	var protocolType, protocol *string
	// kg_maintain first: a group whose members died is reported as Kafka would.
	err := c.pool.QueryRow(ctx, `SELECT state, protocol_type, protocol_name, generation FROM streamd.kg_maintain($1, $2)
		WHERE group_id IS NOT NULL`, group, c.now()).Scan(&g.State, &protocolType, &protocol, &g.Generation)
	switch {
	case err == nil:
		g.ProtocolType, g.Protocol = deref(protocolType), deref(protocol)
		rows, err := c.pool.Query(ctx, `SELECT m.member_id, coalesce(m.instance_id, ''), m.client_id, m.client_host,
			coalesce(m.protocol_metadata[array_position(m.protocol_names, g.protocol_name)], '\x'::bytea),
			coalesce(m.assignment, '\x'::bytea)
			FROM streamd.kafka_group_members m JOIN streamd.kafka_groups g USING (group_id)
			WHERE m.group_id = $1
			  AND m.last_heartbeat + m.session_timeout_ms * interval '1 millisecond' >= now()
			ORDER BY m.join_seq`, group)
		if err != nil {
			return nil, fmt.Errorf("describe group %s: %w", group, err)
		}
		g.Members, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (KafkaGroupMember, error) {
			var m KafkaGroupMember
			err := r.Scan(&m.MemberID, &m.InstanceID, &m.ClientID, &m.ClientHost, &m.Metadata, &m.Assignment)
			return m, err
		})
		if err != nil {
			return nil, fmt.Errorf("describe group %s: %w", group, err)
		}
		return &g, nil
	case errors.Is(err, pgx.ErrNoRows):
	default:
		return nil, fmt.Errorf("describe group %s: %w", group, err)
	}

	// A KIP-848 group is a group from its first join (kafka_consumer_groups), before
	// it consumes a stream.
	var epoch *int64
	err = c.pool.QueryRow(ctx, `SELECT CASE WHEN EXISTS (SELECT 1 FROM streamd.kafka_consumer_groups kc WHERE kc.group_id = $1)
		THEN coalesce(max(group_epoch), 0) ELSE max(group_epoch) END
		FROM streamd.consumer_groups WHERE group_id = $1`, group).Scan(&epoch)
	if err != nil {
		return nil, fmt.Errorf("describe group %s: %w", group, err)
	}
	if epoch == nil {
		return &g, nil
	}
	g.Type, g.ProtocolType, g.Generation, g.State = GroupTypeConsumer, "consumer", int32(*epoch), "Empty"
	rows, err := c.pool.Query(ctx, `SELECT DISTINCT ON (m.id) m.id, m.instance FROM (
		SELECT cr.consumer_id AS id, coalesce(cr.instance_id, '') AS instance
		  FROM streamd.consumer_registrations cr
		 WHERE cr.group_id = $1 AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= now()
		UNION ALL
		SELECT km.member_id, coalesce(km.instance_id, '')
		  FROM streamd.kafka_consumer_members km
		 WHERE km.group_id = $1 AND km.last_heartbeat + km.session_timeout_ms * interval '1 millisecond' >= now()) m
		ORDER BY m.id`, group)
	if err != nil {
		return nil, fmt.Errorf("describe group %s: %w", group, err)
	}
	g.Members, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (KafkaGroupMember, error) {
		var m KafkaGroupMember
		err := r.Scan(&m.MemberID, &m.InstanceID)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("describe group %s: %w", group, err)
	}
	if len(g.Members) > 0 {
		g.State = "Stable"
	}
	return &g, nil
}

// DeleteKafkaGroup deletes a group id everywhere: its classic state and its groups on
// every stream, with their committed offsets. Errors: ErrGroupNotFound,
// ErrGroupNotEmpty (live members, classic or streamd), ErrInvalidGroupID.
func (c *Classic) DeleteKafkaGroup(ctx context.Context, group string) error {
	var found bool
	err := c.pool.QueryRow(ctx, "SELECT streamd.kafka_group_delete($1, $2)", group, c.now()).Scan(&found)
	if err != nil {
		return fmt.Errorf("delete group %s: %w", group, sqlerr.Wrap(err))
	}
	if !found {
		return fmt.Errorf("delete group %s: %w", group, ErrGroupNotFound)
	}
	return nil
}

// StreamPartition names one partition of a stream.
type StreamPartition struct {
	Stream    string
	Partition int32
}

// DeleteOffsets deletes the group's committed offsets of the given partitions (Kafka's
// OffsetDelete), each on its own: ErrGroupSubscribed for a stream the group's live
// members consume, streams.ErrPartitionNotFound for an unknown one. Errors for the
// whole request: ErrGroupNotFound, ErrInvalidArgument.
func (c *Classic) DeleteOffsets(ctx context.Context, group string, partitions []StreamPartition) ([]StreamPartitionResult, error) {
	names, parts := make([]string, len(partitions)), make([]int32, len(partitions))
	for i, p := range partitions {
		names[i], parts[i] = p.Stream, p.Partition
	}
	rows, err := c.pool.Query(ctx, "SELECT entry, outcome FROM streamd.kafka_group_offset_delete($1, $2, $3, $4)",
		group, names, parts, c.now())
	if err != nil {
		return nil, fmt.Errorf("delete offsets of group %s: %w", group, sqlerr.Wrap(err))
	}
	res, err := partitionResults(rows, group, names, parts)
	if err != nil {
		return nil, fmt.Errorf("delete offsets of group %s: %w", group, err)
	}
	return res, nil
}

// GroupStreams returns the streams of a group id, sorted: those it has a streamd
// group on (native and KIP-848 members, committed offsets) and those its classic
// members subscribe to, live or not. None for an unknown group. The Kafka listener
// authorizes group requests against them.
func (c *Classic) GroupStreams(ctx context.Context, group string) ([]string, error) {
	rows, err := c.pool.Query(ctx, `
		SELECT stream_name FROM streamd.consumer_groups WHERE group_id = $1
		UNION
		SELECT unnest(topics) FROM streamd.kafka_group_members WHERE group_id = $1
		ORDER BY 1`, group)
	if err != nil {
		return nil, fmt.Errorf("streams of group %s: %w", group, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("streams of group %s: %w", group, err)
	}
	return out, nil
}
