-- The persistent log: streams, their partitions' head rows, and the events.
--
-- L1: offsets are per partition, gapless and commit-ordered because every append
-- locks and advances its partition's head row (stream_partitions.next_offset) in the
-- appending transaction. L5: every unique constraint includes stream_name.

CREATE TABLE streamd.streams (
    stream_name       text        PRIMARY KEY,
    partitions        integer     NOT NULL CHECK (partitions BETWEEN 1 AND 10000),
    max_payload_bytes integer     NOT NULL DEFAULT 1048576 CHECK (max_payload_bytes > 0),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- One head row per partition, updated by every append (HOT updates: no indexed column
-- changes, and the low fillfactor leaves room on the page for the new versions).
CREATE TABLE streamd.stream_partitions (
    stream_name      text        NOT NULL REFERENCES streamd.streams (stream_name) ON DELETE CASCADE,
    partition        integer     NOT NULL CHECK (partition >= 0),
    next_offset      bigint      NOT NULL DEFAULT 0,  -- the offset the next event gets (log end)
    log_start_offset bigint      NOT NULL DEFAULT 0,  -- the lowest offset not yet deleted by retention
    last_appended_at timestamptz,                     -- makes "timestamp" monotonic per partition
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_name, partition)
) WITH (fillfactor = 20);

-- The events: seed 003's columns, plus partition and key, with the offset per partition.
--   data        JSON payload (NULL with data_bytes NULL: a tombstone, for compaction)
--   data_bytes  opaque binary payload, for values that are not JSON (e.g. Kafka records)
CREATE TABLE streamd.events (
    stream_name    text        NOT NULL,
    partition      integer     NOT NULL,
    "offset"       bigint      NOT NULL,
    event_id       text        NOT NULL DEFAULT gen_random_uuid()::text,
    event_type     text        NOT NULL DEFAULT '',
    key            text,
    data           jsonb,
    data_bytes     bytea,
    metadata       jsonb,
    "timestamp"    timestamptz NOT NULL DEFAULT now(),
    correlation_id text,
    causation_id   text,
    version        integer     NOT NULL DEFAULT 1,
    PRIMARY KEY (stream_name, partition, "offset"),
    CONSTRAINT events_one_payload CHECK (data IS NULL OR data_bytes IS NULL)
);

-- L4: a retried append with the same event_id stores nothing twice.
CREATE UNIQUE INDEX events_stream_event_id ON streamd.events (stream_name, event_id);
