-- Binary payloads for queues (migration 0062): queue_send and queue_send_check take
-- data_bytes and queue_receive returns it, so their older signatures go (sql/doc: a
-- signature change is a migration, not a line kept in the functions file).
DROP FUNCTION IF EXISTS streamd.queue_send(text, text[], text[], text[], bigint[], timestamptz[], text[], integer[], text[], timestamptz, boolean);
DROP FUNCTION IF EXISTS streamd.queue_send_check(streamd.queues, text[], text[], text[], bigint[], integer[], text[]);
DO $$
BEGIN
    -- Only the version without data_bytes in its result (CREATE OR REPLACE cannot
    -- change a result type); a current one is kept.
    IF EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
               WHERE n.nspname = 'streamd' AND p.proname = 'queue_receive' AND NOT ('data_bytes' = ANY(p.proargnames))) THEN
        DROP FUNCTION streamd.queue_receive(text, integer, bigint, timestamptz);
    END IF;
END;
$$;
