-- Consumer groups: groups, members, partition ownership, committed offsets and the
-- dead letter queue. The functions that change them are in
-- sql/functions/0200_consumer_groups.sql; the Go side is package consumergroup.
--
-- G1: each (stream, group, partition) row of consumer_partitions names at most one
-- owner, with the owner's member epoch; commit_offsets accepts a commit only from that
-- owner at that epoch, checked under a row lock in the same statement.
-- L5: every unique constraint includes stream_name.

-- One row per group and stream. Every membership or assignment change locks this row
-- (SELECT ... FOR UPDATE), so group changes serialize.
CREATE TABLE streamd.consumer_groups (
    stream_name  text        NOT NULL REFERENCES streamd.streams (stream_name) ON DELETE CASCADE,
    group_id     text        NOT NULL,
    group_epoch  bigint      NOT NULL DEFAULT 0,  -- bumped by every membership change; new members take it
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_name, group_id)
);

-- The members: seed 003's columns, plus the member epoch (the fence token), the static
-- instance id, the rebalance timeout and the last time the member's handlers made
-- progress.
CREATE TABLE streamd.consumer_registrations (
    stream_name          text        NOT NULL,
    group_id             text        NOT NULL,
    consumer_id          text        NOT NULL,
    registered_at        timestamptz NOT NULL DEFAULT now(),
    last_heartbeat       timestamptz NOT NULL DEFAULT now(),
    session_timeout_ms   integer     NOT NULL DEFAULT 30000 CHECK (session_timeout_ms > 0),
    member_epoch         bigint      NOT NULL,
    instance_id          text,
    rebalance_timeout_ms integer     NOT NULL DEFAULT 60000 CHECK (rebalance_timeout_ms > 0),
    last_poll_at         timestamptz,
    PRIMARY KEY (stream_name, group_id, consumer_id),
    FOREIGN KEY (stream_name, group_id) REFERENCES streamd.consumer_groups (stream_name, group_id) ON DELETE CASCADE
);

CREATE UNIQUE INDEX consumer_registrations_instance
    ON streamd.consumer_registrations (stream_name, group_id, instance_id) WHERE instance_id IS NOT NULL;
CREATE INDEX consumer_registrations_heartbeat ON streamd.consumer_registrations (last_heartbeat);

-- Partition ownership. owner_id/owner_epoch: the member that may process and commit
-- the partition now. target_id: the member the assignor wants it to go to; the move
-- happens when the owner releases the partition (after committing) or is expired.
-- paused: the group does not process the partition until resumed (survives handover).
CREATE TABLE streamd.consumer_partitions (
    stream_name  text        NOT NULL,
    group_id     text        NOT NULL,
    partition    integer     NOT NULL CHECK (partition >= 0),
    owner_id     text,
    owner_epoch  bigint,
    target_id    text,
    target_since timestamptz,
    paused       boolean     NOT NULL DEFAULT false,
    assigned_at  timestamptz,
    PRIMARY KEY (stream_name, group_id, partition),
    FOREIGN KEY (stream_name, group_id) REFERENCES streamd.consumer_groups (stream_name, group_id) ON DELETE CASCADE,
    CHECK ((owner_id IS NULL) = (owner_epoch IS NULL))
);

-- Committed offsets, one per (stream, group, partition): the next offset to read (G5).
-- consumer_id is the member that committed it last, so the seed's query
--   SELECT "offset" FROM consumer_offsets WHERE stream_name = .. AND group_id = .. AND consumer_id = ..
-- still answers.
CREATE TABLE streamd.consumer_offsets (
    stream_name  text        NOT NULL,
    group_id     text        NOT NULL,
    partition    integer     NOT NULL CHECK (partition >= 0),
    "offset"     bigint      NOT NULL CHECK ("offset" >= 0),
    consumer_id  text,
    member_epoch bigint,
    metadata     text,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_name, group_id, partition),
    FOREIGN KEY (stream_name, group_id) REFERENCES streamd.consumer_groups (stream_name, group_id) ON DELETE CASCADE
);

CREATE INDEX consumer_offsets_consumer ON streamd.consumer_offsets (stream_name, group_id, consumer_id);

-- Records a group's handler gave up on (seeds 000 and 001), with the event copied so
-- that retention deleting the event loses nothing. status: pending until replayed
-- (appended to the stream again) or discarded.
CREATE TABLE streamd.dead_letter_queue (
    stream_name      text        NOT NULL,
    id               bigint      GENERATED ALWAYS AS IDENTITY,
    group_id         text        NOT NULL,
    partition        integer     NOT NULL,
    "offset"         bigint      NOT NULL,
    event_id         text        NOT NULL,
    event_type       text        NOT NULL DEFAULT '',
    key              text,
    data             jsonb,
    data_bytes       bytea,
    metadata         jsonb,
    event_timestamp  timestamptz,
    error            text        NOT NULL,
    attempts         integer     NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    first_failure_at timestamptz NOT NULL DEFAULT now(),
    last_failure_at  timestamptz NOT NULL DEFAULT now(),
    status           text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'replayed', 'discarded')),
    resolved_at      timestamptz,
    resolved_by      text,
    PRIMARY KEY (stream_name, id),
    UNIQUE (stream_name, group_id, partition, "offset")
);

CREATE INDEX dead_letter_queue_status ON streamd.dead_letter_queue (stream_name, group_id, status);
