-- Objects removed or replaced since they were first applied. Functions whose signature
-- or result type changed: CREATE OR REPLACE in sql/functions cannot change those, and
-- the old versions would stay beside the new ones (an old queue_send matched calls
-- with the old arguments).
-- These DROPs lived at the top of the functions files, re-run on every change of any
-- function; a signature change is a migration (see the package doc, sql/doc.go).
-- Nothing depends on them. On a new database none of them exists.
DROP FUNCTION IF EXISTS streamd.set_partitions_paused(text, text, integer[], boolean);
DROP FUNCTION IF EXISTS streamd.queue_ack(text, bigint[], uuid[], timestamptz);
DROP FUNCTION IF EXISTS streamd.queue_nack(text, bigint[], uuid[], bigint[], text[], timestamptz);
DROP FUNCTION IF EXISTS streamd.queue_extend(text, bigint[], uuid[], bigint, timestamptz);
DROP FUNCTION IF EXISTS streamd.queue_term(text, bigint[], uuid[], text[], timestamptz);
-- queue_send gained p_fresh_ids (with a default: a call with the old arguments would
-- otherwise match both).
DROP FUNCTION IF EXISTS streamd.queue_send(text, text[], text[], text[], bigint[], timestamptz[], text[], integer[], text[], timestamptz);
-- Groups are per tenant (migration 0014): queue_lock_groups returns the groups' tenants
-- too, and queue_groups_advance takes them.
DROP FUNCTION IF EXISTS streamd.queue_lock_groups(text, bigint[], uuid[]);
DROP FUNCTION IF EXISTS streamd.queue_groups_advance(text, text[], timestamptz);
DROP FUNCTION IF EXISTS streamd.append_versioned(text, integer[], text[], text[], text[], text[], bytea[], text[], text[],
                                                 text[], integer[], bigint[], text, timestamptz);
DROP FUNCTION IF EXISTS streamd.open_key_session(text, text, text, interval, timestamptz);

-- The reason a group partition is not progressing is a column of
-- consumer_group_status (sql/views/0200_consumer_group_views.sql); the earlier separate
-- view is gone.
DROP VIEW IF EXISTS streamd.consumer_group_progress;
