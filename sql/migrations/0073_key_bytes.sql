-- Kafka record keys are bytes (issue 19). A key that is UTF-8 text without NUL bytes
-- stays in key (text: partitioning, compaction, the event store and SQL see it as
-- before); any other key, and an empty one (Kafka tells an empty key from none), is
-- kept exactly in key_bytes, with key NULL. At most one of the two is set. The
-- constraint is NOT VALID: the column is new, so every existing row satisfies it, and
-- validating would scan the log under an exclusive lock; new rows are checked.
ALTER TABLE streamd.events ADD COLUMN key_bytes bytea;
ALTER TABLE streamd.events ADD CONSTRAINT events_one_key CHECK (key IS NULL OR key_bytes IS NULL) NOT VALID;
