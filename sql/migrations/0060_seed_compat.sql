-- Seed 003's own SQL, unchanged (issue 20, point 1).
--
-- Offsets. Seed 003 commits with
--   INSERT INTO consumer_offsets (stream_name, group_id, consumer_id, "offset") VALUES (...)
--   ON CONFLICT (stream_name, group_id, consumer_id) DO UPDATE SET "offset" = EXCLUDED."offset", updated_at = NOW()
-- which PostgreSQL plans only when a unique index has exactly those three columns.
-- consumer_offsets is per (stream, group, partition) (G5) and its consumer_id was the
-- member that committed last, the same member on every partition it owns, so no such
-- index could exist. consumer_id is now the seed's consumer: the name a seed-form
-- commit gave (NULL for the library's commits), unique within a group; the member
-- that committed last is committed_by. A seed-form commit (no partition) is resolved
-- by the trigger consumer_offsets_seed_form (sql/functions/0250_seed_compat.sql);
-- partition stays NOT NULL, which PostgreSQL checks after BEFORE triggers.
ALTER TABLE streamd.consumer_offsets ADD COLUMN committed_by text;
UPDATE streamd.consumer_offsets SET committed_by = consumer_id, consumer_id = NULL;
DROP INDEX streamd.consumer_offsets_consumer;
CREATE UNIQUE INDEX consumer_offsets_seed_consumer ON streamd.consumer_offsets (stream_name, group_id, consumer_id);

-- Messages. A plain INSERT INTO streamd.messages (seed 003's table) goes through the
-- trigger messages_plain_insert, which applies the queue's settings. The columns the
-- queue's settings fill have no default of their own any more, so that the trigger
-- can tell "not given" (NULL) from a value the insert chose.
ALTER TABLE streamd.messages ALTER COLUMN max_delivery_attempts DROP DEFAULT;

-- The seed's count limit is per stream; streamd's is per partition (as Kafka's
-- retention.bytes is): said where a user reads it.
COMMENT ON COLUMN streamd.retention_policies.max_event_count IS
    'keep at most this many newest events PER PARTITION (not per stream, unlike seed 003); a stream of N partitions keeps up to N times this';
COMMENT ON COLUMN streamd.retention_policies.max_size_bytes IS
    'keep at most this many stored payload bytes PER PARTITION';
