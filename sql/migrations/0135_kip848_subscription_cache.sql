-- KIP-848 subscriptions resolved once per change (issue 19; consumergroup/kip848.go,
-- kip848_cache.go). A heartbeat used to read every stream name and compile the
-- member's regex to resolve its subscription, and, when the subscription took in a
-- virtual topic (the Kafka listener's __consumer_offsets), to read every member of the
-- group and compile each one's regex. Now:
--
-- stream_set_version counts the changes of the set of streams (a stream created or
-- deleted). It is read with each KIP-848 heartbeat; a subscription is resolved again
-- only when it or this number changed since the process last resolved it. The bump
-- runs in the transaction that changes the set, so a reader that sees the new number
-- sees the new set. It is a deferred constraint trigger: the one row is locked only
-- for the last moment of a creating or deleting transaction, not for its whole length.
CREATE TABLE IF NOT EXISTS streamd.stream_set_version (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    version  bigint  NOT NULL DEFAULT 0
);
INSERT INTO streamd.stream_set_version DEFAULT VALUES ON CONFLICT DO NOTHING;

-- Also in sql/functions/0225_kafka_consumer_members.sql (re-created there; the trigger
-- below needs it first).
CREATE OR REPLACE FUNCTION streamd.stream_set_changed()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE streamd.stream_set_version SET version = version + 1;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS stream_set_changed ON streamd.streams;
CREATE CONSTRAINT TRIGGER stream_set_changed AFTER INSERT OR DELETE ON streamd.streams
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION streamd.stream_set_changed();

-- virtual_topics are the virtual topics (ConsumerHeartbeat.Virtual) the member's
-- subscription takes in, resolved by the member's own calls when its subscription
-- changes: a member's share of them is counted in SQL from this column, without
-- reading and compiling the other members' subscriptions.
ALTER TABLE streamd.kafka_consumer_members ADD COLUMN IF NOT EXISTS virtual_topics text[] NOT NULL DEFAULT '{}';

-- kafka_consumer_heartbeat returns virtual_topics too.
DROP FUNCTION IF EXISTS streamd.kafka_consumer_heartbeat(text, text, integer, text[], text, timestamptz);
