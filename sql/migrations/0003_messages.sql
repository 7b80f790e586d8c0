-- Ephemeral streams: the visibility-timeout queue (messages/ package, Q1 and Q2).
--
-- A queue is a row of streamd.queues; its messages are rows of streamd.messages with
-- stream_name = the queue's name (seed 003's columns, plus the lease token, the FIFO
-- group key and the dead-letter provenance). A dead-letter queue is a queue like any
-- other: dead-lettering moves the row there in one transaction.
--
-- "offset" comes from one sequence: a queue, unlike the log (L1), promises no gapless
-- or commit-ordered offsets, and a per-queue head row would serialise every send to a
-- queue. Unique constraints still include stream_name (L5). Within a FIFO group, sends
-- are serialised by the group's row, so offsets in a group follow commit order.

CREATE TABLE streamd.queues (
    queue_name            text        PRIMARY KEY,
    fifo                  boolean     NOT NULL DEFAULT false,
    visibility_timeout_ms bigint      NOT NULL DEFAULT 30000 CHECK (visibility_timeout_ms > 0),
    max_delivery_attempts integer     NOT NULL DEFAULT 5 CHECK (max_delivery_attempts >= 1),
    dead_letter_queue     text        CHECK (dead_letter_queue <> queue_name),
    max_payload_bytes     integer     NOT NULL DEFAULT 262144 CHECK (max_payload_bytes > 0),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);

-- The messages. visibility_timeout is the time the message is (again) visible:
-- enqueued_at (+ delay) when sent, the lease's end while received, now (+ delay) after
-- a nack. A row is in flight while lease_token IS NOT NULL and visibility_timeout is in
-- the future; the token stays after the lease expires so that a late but uncontested
-- ack still settles, and a new receive replaces it (a stale receipt then fails).
--
-- The table churns (insert, update per receive, delete per ack): autovacuum runs after
-- 1% of it is dead instead of 20%, without cost-based sleeping, and pages keep room
-- for the receive's new row version.
CREATE TABLE streamd.messages (
    stream_name           text        NOT NULL,
    "offset"              bigserial   NOT NULL,
    message_id            text        NOT NULL,
    data                  jsonb       NOT NULL,
    metadata              jsonb,                     -- the headers: a JSON object of strings
    enqueued_at           timestamptz NOT NULL DEFAULT now(),
    visibility_timeout    timestamptz NOT NULL DEFAULT now(),
    delivery_attempts     integer     NOT NULL DEFAULT 0,
    max_delivery_attempts integer     NOT NULL DEFAULT 5,
    dead_letter_stream    text,                      -- NULL: retried until acked or termed
    lease_token           uuid,
    group_key             text,                      -- FIFO message group (FIFO queues only)
    last_error            text,
    origin_stream         text,                      -- dead letters: the queue it came from
    origin_offset         bigint,
    origin_attempts       integer,
    dead_lettered_at      timestamptz,
    PRIMARY KEY (stream_name, "offset"),
    CONSTRAINT messages_stream_message_id UNIQUE (stream_name, message_id)
) WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- Receive: visible messages of a queue, in visible-at order, as an index range scan.
CREATE INDEX messages_visible ON streamd.messages (stream_name, visibility_timeout, "offset");
-- FIFO: the head (lowest offset) of a group.
CREATE INDEX messages_group ON streamd.messages (stream_name, group_key, "offset") WHERE group_key IS NOT NULL;
-- Stats: how many dead letters came from a queue.
CREATE INDEX messages_origin ON streamd.messages (origin_stream) WHERE origin_stream IS NOT NULL;

-- FIFO message groups with at least one message. The row serialises its group: sends
-- to the group lock it before they insert (so offsets follow commit order), and a
-- receive locks it (SKIP LOCKED) to lease the group's head, the only message of the
-- group that can be in flight. visible_at is when the group may deliver next: the
-- head's lease end, the end of a nack delay, or the time of the last settlement (so
-- ordering groups by visible_at serves them round robin).
CREATE TABLE streamd.message_groups (
    stream_name text        NOT NULL,
    group_key   text        NOT NULL,
    visible_at  timestamptz NOT NULL,
    PRIMARY KEY (stream_name, group_key)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);

CREATE INDEX message_groups_visible ON streamd.message_groups (stream_name, visible_at);
