-- Kafka classic-protocol groups (JoinGroup/SyncGroup/Heartbeat/LeaveGroup). The
-- functions are in sql/functions/0220_kafka_groups.sql; the Go side is
-- consumergroup.Classic, the wire side package kafka.
--
-- A classic group's state lives here, so any streamd instance can be its coordinator
-- and a client that loses one instance carries on against another. Its committed
-- offsets are NOT here: they are the rows of streamd.consumer_offsets, per (stream,
-- group, partition), the same rows native groups use, so consumer_group_status, the
-- lag metrics, groups describe and consumer-aware retention cover Kafka groups too.
--
-- A group id is either a classic group (rows here) or a native/KIP-848 group (rows in
-- consumer_registrations), never both at once with members: the join of the other
-- kind is refused (Kafka's INCONSISTENT_GROUP_PROTOCOL).

-- One row per classic group. Every state change locks this row FOR NO KEY UPDATE;
-- offset commits lock it FOR SHARE, so a generation cannot complete while a commit of
-- the previous one is being written (the generation fence).
--   state: Empty, PreparingRebalance (members are rejoining; the rebalance completes
--   when all have, or at rebalance_deadline without the missing ones),
--   CompletingRebalance (the generation is formed; the leader's SyncGroup brings the
--   assignment), Stable.
CREATE TABLE streamd.kafka_groups (
    group_id           text        PRIMARY KEY,
    protocol_type      text,
    protocol_name      text,
    generation         integer     NOT NULL DEFAULT 0 CHECK (generation >= 0),
    state              text        NOT NULL DEFAULT 'Empty'
                                   CHECK (state IN ('Empty', 'PreparingRebalance', 'CompletingRebalance', 'Stable')),
    leader_id          text,
    rebalance_deadline timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- The members of classic groups. protocol_names/protocol_metadata: the assignors the
-- member supports, in its order of preference, with their metadata (opaque bytes for
-- the group; the leader decodes them). topics: the subscription, decoded by the wire
-- layer when the protocol type is "consumer" (OffsetDelete and describe use it).
-- joined: the member rejoined during the current PreparingRebalance. generation: the
-- generation the member belongs to (NULL before its first completed one).
-- assignment: what the leader's SyncGroup gave it for that generation.
CREATE TABLE streamd.kafka_group_members (
    group_id             text        NOT NULL REFERENCES streamd.kafka_groups (group_id) ON DELETE CASCADE,
    member_id            text        NOT NULL,
    instance_id          text,
    client_id            text        NOT NULL DEFAULT '',
    client_host          text        NOT NULL DEFAULT '',
    session_timeout_ms   integer     NOT NULL CHECK (session_timeout_ms > 0),
    rebalance_timeout_ms integer     NOT NULL CHECK (rebalance_timeout_ms > 0),
    protocol_type        text        NOT NULL,
    protocol_names       text[]      NOT NULL,
    protocol_metadata    bytea[]     NOT NULL,
    topics               text[]      NOT NULL DEFAULT '{}',
    joined               boolean     NOT NULL DEFAULT false,
    join_seq             bigint      NOT NULL,
    generation           integer,
    assignment           bytea,
    last_heartbeat       timestamptz NOT NULL,
    PRIMARY KEY (group_id, member_id),
    CHECK (cardinality(protocol_names) = cardinality(protocol_metadata) AND cardinality(protocol_names) > 0)
);

CREATE UNIQUE INDEX kafka_group_members_instance
    ON streamd.kafka_group_members (group_id, instance_id) WHERE instance_id IS NOT NULL;

-- The order in which members joined: the first to join a generation leads it.
CREATE SEQUENCE streamd.kafka_group_join_seq;

-- The partitions each member of the current generation was given, when the wire layer
-- could decode the leader's assignment (protocol type "consumer"): how
-- consumer_group_status shows the owners of a classic group's partitions. Replaced by
-- every leader's SyncGroup; a member's rows go with it.
CREATE TABLE streamd.kafka_group_assignments (
    stream_name text    NOT NULL,
    group_id    text    NOT NULL,
    partition   integer NOT NULL,
    member_id   text    NOT NULL,
    PRIMARY KEY (stream_name, group_id, partition),
    FOREIGN KEY (group_id, member_id) REFERENCES streamd.kafka_group_members (group_id, member_id)
        ON DELETE CASCADE ON UPDATE CASCADE
);

CREATE INDEX kafka_group_assignments_member ON streamd.kafka_group_assignments (group_id, member_id);
