-- Retention policies and per-stream configuration (issue 5; packages retention/ and
-- streamconfig/). The functions are in sql/functions/0400_*.sql, the views in
-- sql/views/0400_*.sql.
--
-- One source of truth: retention_policies is what retention executes (typed columns,
-- checked here). stream_configurations.retention_config is its JSON face in seed 003's
-- form; triggers (sql/functions/0410_stream_config.sql) keep the two identical in the
-- writing statement, whichever of them was written, so no committed state has them
-- disagree. docs/retention.md explains the choice.

-- Seed 003's columns (stream_name, max_age_seconds, max_event_count, enabled,
-- created_at, updated_at), plus:
--   max_size_bytes              keep at most this many stored payload bytes per partition
--   cleanup_policy              'delete' (prefix deletion by age/count/size), 'compact'
--                               (keep the latest record per key), or both
--   tombstone_retention_seconds how long compaction keeps a tombstone (data and
--                               data_bytes NULL) that is the latest record of its key
--   protect_consumers           never delete below the committed offset of a live group
--                               (a group with a member inside its session timeout)
-- The limits are per partition: the log is partitioned, and so are offsets.
CREATE TABLE streamd.retention_policies (
    stream_name                 text        PRIMARY KEY REFERENCES streamd.streams (stream_name) ON DELETE CASCADE,
    max_age_seconds             integer     CHECK (max_age_seconds > 0),
    max_event_count             integer     CHECK (max_event_count >= 0),
    enabled                     boolean     NOT NULL DEFAULT true,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now(),
    max_size_bytes              bigint      CHECK (max_size_bytes >= 0),
    cleanup_policy              text        NOT NULL DEFAULT 'delete'
                                            CHECK (cleanup_policy IN ('delete', 'compact', 'compact,delete')),
    tombstone_retention_seconds integer     NOT NULL DEFAULT 86400 CHECK (tombstone_retention_seconds >= 0),
    protect_consumers           boolean     NOT NULL DEFAULT false
);

-- The scheduler's scan: the enabled policies. (Seed 003 indexes the boolean itself;
-- a partial index on the key is smaller and as useful.)
CREATE INDEX retention_policies_enabled ON streamd.retention_policies (stream_name) WHERE enabled;

-- Seed 003's per-stream configuration. Each *_config column is a JSON object in the
-- seed's camelCase form; streamconfig/ gives them Go types and validates them on write.
CREATE TABLE streamd.stream_configurations (
    stream_name           text        PRIMARY KEY REFERENCES streamd.streams (stream_name) ON DELETE CASCADE,
    retention_config      jsonb       CHECK (jsonb_typeof(retention_config) = 'object'),
    dead_letter_config    jsonb       CHECK (jsonb_typeof(dead_letter_config) = 'object'),
    lifecycle_config      jsonb       CHECK (jsonb_typeof(lifecycle_config) = 'object'),
    performance_config    jsonb       CHECK (jsonb_typeof(performance_config) = 'object'),
    access_control_config jsonb       CHECK (jsonb_typeof(access_control_config) = 'object'),
    tags                  jsonb       CHECK (jsonb_typeof(tags) = 'object'),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);
