-- Low-latency delivery: the publication the tailer reads (see
-- sql/functions/0600_wakeup.sql). Created here when the migrating role may; otherwise
-- the migration still succeeds, and the tailer calls the same function again on
-- every start, so granting the privilege later is enough.
--
-- The function is defined here as well as in sql/functions because migrations run
-- before functions are (re)applied.
CREATE OR REPLACE FUNCTION streamd.wakeup_publication_ensure() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = 'streamd_wakeups') THEN
        RETURN true;
    END IF;
    BEGIN
        IF current_setting('server_version_num')::int >= 150000 THEN
            EXECUTE 'CREATE PUBLICATION streamd_wakeups'
                ' FOR TABLE streamd.events (stream_name, partition), streamd.messages (stream_name)'
                ' WITH (publish = ''insert'')';
        ELSE
            EXECUTE 'CREATE PUBLICATION streamd_wakeups'
                ' FOR TABLE streamd.events, streamd.messages WITH (publish = ''insert'')';
        END IF;
    EXCEPTION
        WHEN insufficient_privilege THEN
            RAISE NOTICE 'streamd: no privilege to create publication streamd_wakeups (%); wake-ups come from polling', SQLERRM;
            RETURN false;
        WHEN duplicate_object OR unique_violation THEN
            RETURN true;
    END;
    RETURN true;
END
$$;

SELECT streamd.wakeup_publication_ensure();
