-- Event sourcing on the log (issue 9): per-key versions, exclusive writer sessions,
-- snapshots, and the event type registry.
--
-- events.version already means "event schema version" (seed 003), so the per-key
-- sequence is a new column, key_version: 1, 2, 3, ... within (stream_name, key), set
-- only on streams that opted in (streams.key_versions). On every other stream it stays
-- NULL, costs one bit of the null bitmap, and never enters the partial index below.

ALTER TABLE streamd.streams
    ADD COLUMN key_versions        boolean NOT NULL DEFAULT false,
    ADD COLUMN enforce_event_types boolean NOT NULL DEFAULT false;

ALTER TABLE streamd.events ADD COLUMN key_version bigint;

-- Reading one key's events in version order is a range scan of this index, and it is
-- the backstop of the version sequence: no two events of a key share a version.
CREATE UNIQUE INDEX events_stream_key_version ON streamd.events (stream_name, key, key_version)
    WHERE key_version IS NOT NULL;

-- One row per key of a versioned stream: the key's last version and the exclusive
-- writer session holding it, if any. The append path upserts it under the partition's
-- head-row lock, so the version survives retention deleting the key's events, and
-- finding it is one primary-key probe. Updated in place (HOT: no indexed column changes).
CREATE TABLE streamd.key_heads (
    stream_name        text        NOT NULL REFERENCES streamd.streams (stream_name) ON DELETE CASCADE,
    key                text        NOT NULL,
    last_version       bigint      NOT NULL DEFAULT 0 CHECK (last_version >= 0),
    session_id         text,
    session_expires_at timestamptz,
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_name, key),
    CONSTRAINT key_heads_session CHECK ((session_id IS NULL) = (session_expires_at IS NULL))
) WITH (fillfactor = 50);

-- A state of a key at version key_version (seed 004): the state after applying the
-- key's events 1..key_version.
CREATE TABLE streamd.snapshots (
    stream_name text        NOT NULL REFERENCES streamd.streams (stream_name) ON DELETE CASCADE,
    key         text        NOT NULL,
    key_version bigint      NOT NULL CHECK (key_version > 0),
    data        jsonb,
    data_bytes  bytea,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_name, key, key_version),
    CONSTRAINT snapshots_one_payload CHECK ((data IS NULL) <> (data_bytes IS NULL))
);

-- Registered event types (seed 002). A stream with enforce_event_types accepts only
-- events whose event_type is registered here.
CREATE TABLE streamd.event_types (
    name            text        PRIMARY KEY CHECK (name <> ''),
    description     text        NOT NULL DEFAULT '',
    reference_table text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
