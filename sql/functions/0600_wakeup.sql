-- Low-latency delivery (internal/tailer, wakeup/). Applied idempotently on every
-- migrate.
--
-- The tailer reads committed inserts into streamd.events and streamd.queue_messages through
-- logical replication (pgoutput) from the publication streamd_wakeups
-- (publish_via_partition_root: a queue's partition's inserts arrive as the parent's). The
-- publication carries inserts only, and only the columns a wake-up needs (the stream
-- or queue name and the partition), so payloads never cross the replication
-- connection. The broadcaster re-sends wake-ups with pg_notify on channel
-- streamd_wakeup from its own short transactions.

-- Creates the publication streamd_wakeups when it is missing and the role may (it
-- must own both tables and have CREATE on the database). Returns whether the
-- publication exists afterwards; lack of privilege is not an error: wake-ups then
-- come from polling alone. Safe to call concurrently and repeatedly.
CREATE OR REPLACE FUNCTION streamd.wakeup_publication_ensure() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = 'streamd_wakeups') THEN
        -- A publication made before migration 0086 lost streamd.messages with that
        -- table: the queues' inserts are those of streamd.queue_messages now.
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication_tables
                       WHERE pubname = 'streamd_wakeups' AND schemaname = 'streamd' AND tablename = 'queue_messages') THEN
            BEGIN
                -- queue_messages is partitioned by queue (migration 0215): its
                -- partitions' inserts are published as the parent's, so the tailer
                -- sees one relation, queue_messages, whatever the queue.
                IF NOT (SELECT p.pubviaroot FROM pg_catalog.pg_publication p WHERE p.pubname = 'streamd_wakeups') THEN
                    EXECUTE 'ALTER PUBLICATION streamd_wakeups SET (publish = ''insert'', publish_via_partition_root = true)';
                END IF;
                IF current_setting('server_version_num')::int >= 150000 THEN
                    EXECUTE 'ALTER PUBLICATION streamd_wakeups ADD TABLE streamd.queue_messages (stream_name)';
                ELSE
                    EXECUTE 'ALTER PUBLICATION streamd_wakeups ADD TABLE streamd.queue_messages';
                END IF;
            EXCEPTION
                WHEN insufficient_privilege THEN
                    RAISE NOTICE 'streamd: no privilege to add streamd.queue_messages to publication streamd_wakeups (%); queue wake-ups come from polling', SQLERRM;
                    RETURN true;
                WHEN duplicate_object THEN
                    RETURN true; -- a concurrent call added it
            END;
        END IF;
        RETURN true;
    END IF;
    BEGIN
        IF current_setting('server_version_num')::int >= 150000 THEN
            -- Column lists (PostgreSQL 15): only what a wake-up needs.
            EXECUTE 'CREATE PUBLICATION streamd_wakeups'
                ' FOR TABLE streamd.events (stream_name, partition), streamd.queue_messages (stream_name)'
                ' WITH (publish = ''insert'', publish_via_partition_root = true)';
        ELSE
            EXECUTE 'CREATE PUBLICATION streamd_wakeups'
                ' FOR TABLE streamd.events, streamd.queue_messages WITH (publish = ''insert'')';
        END IF;
    EXCEPTION
        WHEN insufficient_privilege THEN
            RAISE NOTICE 'streamd: no privilege to create publication streamd_wakeups (%); wake-ups come from polling', SQLERRM;
            RETURN false;
        WHEN duplicate_object OR unique_violation THEN
            RETURN true; -- a concurrent call created it
    END;
    RETURN true;
END
$$;

-- Create the publication now if the migrating role may (a no-op when it exists).
SELECT streamd.wakeup_publication_ensure();
