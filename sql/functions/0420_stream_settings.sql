-- The keys of stream_configurations' dead_letter_config, lifecycle_config and
-- performance_config (issue 20, point 3). Applied idempotently on every migrate.
--
-- Every door (streamconfig.Store.Set, `streamd stream config set`, the API, a plain
-- INSERT or UPDATE of stream_configurations) goes through the table's trigger
-- (stream_configurations_before_write, sql/functions/0410_stream_config.sql), which
-- calls streamd.config_check_settings for these sections: an unknown key or a value
-- of the wrong type or range is refused with SD301 naming the key, and nothing is
-- written. docs/retention.md lists every key and what it does.
--
-- dead_letter_config:
--   enabled              boolean, default false
--   maxDeliveryAttempts  integer 0 to 1000, default 0 (the group's or queue's own)
--   stream               a stream name, default none: a group's dead letters are also
--                        appended there (dead_letter_event)
--   backoff              duration between a failed attempt and the next, whole
--                        seconds, 0 to 68 years, default none
-- lifecycle_config:
--   readOnly             boolean, default false: appends to the stream are refused
--   archiveAfter         duration > 0 of no appends, default never
--   deleteAfter          duration > 0 of no appends, default never
-- performance_config:
--   batchSize            integer 1 to 100000, default none (the client's)
--   enableCompression    boolean, default none: Kafka fetches of the stream return
--                        compressed record batches (true), uncompressed ones (false),
--                        or the Kafka listener's default (absent)
--   compressionCodec     gzip, snappy, lz4 or zstd, only with enableCompression
--                        true; default lz4

-- Raises SD301 naming p_section.key for the first key of p_value that is not in
-- p_keys (p_types: the JSON type each needs, parallel), or whose value has another
-- type. NULL (the key's JSON null) is allowed: it means the default.
CREATE OR REPLACE FUNCTION streamd.config_check_keys(p_section text, p_value jsonb, p_keys text[], p_types text[])
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_key  text;
    v_type text;
BEGIN
    PERFORM streamd.config_check_section(p_section, p_value);
    IF p_value IS NULL THEN
        RETURN;
    END IF;
    SELECT k INTO v_key FROM jsonb_object_keys(p_value) k WHERE k <> ALL (p_keys) ORDER BY k LIMIT 1;
    IF v_key IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301',
            MESSAGE = format('%s.%s: unknown key (the keys are %s)', p_section, v_key, array_to_string(p_keys, ', '));
    END IF;
    FOR i IN 1 .. cardinality(p_keys) LOOP
        v_type := jsonb_typeof(p_value -> p_keys[i]);
        IF v_type IS NOT NULL AND v_type <> 'null' AND v_type <> p_types[i]
           AND NOT (p_types[i] = 'duration' AND v_type IN ('string', 'number')) THEN
            RAISE EXCEPTION USING ERRCODE = 'SD301',
                MESSAGE = format('%s.%s: %s is not a %s', p_section, p_keys[i], p_value -> p_keys[i],
                                 CASE p_types[i] WHEN 'boolean' THEN 'boolean (true or false)' WHEN 'number' THEN 'number'
                                      WHEN 'string' THEN 'string' ELSE 'duration ("d.hh:mm:ss", "720h" or seconds)' END);
        END IF;
    END LOOP;
END;
$$;

-- Raises SD301 naming the field when p_value, a JSON number, is not a whole number in
-- [p_min, p_max].
CREATE OR REPLACE FUNCTION streamd.config_check_int(p_field text, p_value jsonb, p_min numeric, p_max numeric)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NULL OR jsonb_typeof(p_value) = 'null' THEN
        RETURN;
    END IF;
    IF p_value::numeric <> trunc(p_value::numeric) OR p_value::numeric < p_min OR p_value::numeric > p_max THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301',
            MESSAGE = format('%s: %s must be a whole number from %s to %s', p_field, p_value, p_min, p_max);
    END IF;
END;
$$;

-- Validates the dead-letter, lifecycle and performance sections (see the top).
CREATE OR REPLACE FUNCTION streamd.config_check_settings(p_dead_letter jsonb, p_lifecycle jsonb, p_performance jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_secs bigint;
BEGIN
    PERFORM streamd.config_check_keys('dead_letter_config', p_dead_letter,
        ARRAY['backoff', 'enabled', 'maxDeliveryAttempts', 'stream'], ARRAY['duration', 'boolean', 'number', 'string']);
    PERFORM streamd.config_check_int('dead_letter_config.maxDeliveryAttempts', p_dead_letter -> 'maxDeliveryAttempts', 0, 1000);
    IF p_dead_letter ? 'stream' AND jsonb_typeof(p_dead_letter -> 'stream') = 'string'
       AND NOT streamd.valid_stream_name(p_dead_letter ->> 'stream') THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301',
            MESSAGE = format('dead_letter_config.stream: %s is not a valid stream name', p_dead_letter -> 'stream');
    END IF;
    PERFORM streamd.config_duration_seconds('dead_letter_config.backoff', p_dead_letter -> 'backoff');

    PERFORM streamd.config_check_keys('lifecycle_config', p_lifecycle,
        ARRAY['archiveAfter', 'deleteAfter', 'readOnly'], ARRAY['duration', 'duration', 'boolean']);
    FOREACH v_secs IN ARRAY ARRAY[streamd.config_duration_seconds('lifecycle_config.archiveAfter', p_lifecycle -> 'archiveAfter'),
                                  streamd.config_duration_seconds('lifecycle_config.deleteAfter', p_lifecycle -> 'deleteAfter')] LOOP
        IF v_secs = 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'SD301',
                MESSAGE = format('lifecycle_config: archiveAfter and deleteAfter must be positive, got %s', p_lifecycle);
        END IF;
    END LOOP;

    PERFORM streamd.config_check_keys('performance_config', p_performance,
        ARRAY['batchSize', 'compressionCodec', 'enableCompression'], ARRAY['number', 'string', 'boolean']);
    PERFORM streamd.config_check_int('performance_config.batchSize', p_performance -> 'batchSize', 1, 100000);
    IF jsonb_typeof(p_performance -> 'compressionCodec') = 'string' THEN
        IF NOT (p_performance ->> 'compressionCodec') = ANY (ARRAY['gzip', 'snappy', 'lz4', 'zstd']) THEN
            RAISE EXCEPTION USING ERRCODE = 'SD301',
                MESSAGE = format('performance_config.compressionCodec: %s is not gzip, snappy, lz4 or zstd',
                                 p_performance -> 'compressionCodec');
        END IF;
        IF jsonb_typeof(p_performance -> 'enableCompression') IS DISTINCT FROM 'boolean'
           OR NOT (p_performance ->> 'enableCompression')::boolean THEN
            RAISE EXCEPTION USING ERRCODE = 'SD301',
                MESSAGE = format('performance_config.compressionCodec: %s needs enableCompression true',
                                 p_performance -> 'compressionCodec');
        END IF;
    END IF;
END;
$$;

-- lifecycle_config.readOnly onto streams.read_only (migration 0064), in the writing
-- statement. The append paths (streamd.append, append_versioned, append_reserve, the
-- plain-INSERT trigger) refuse a read-only stream with SD005.
CREATE OR REPLACE FUNCTION streamd.stream_configurations_lifecycle() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_ro boolean := false;
BEGIN
    IF TG_OP <> 'DELETE' THEN
        v_ro := coalesce((NEW.lifecycle_config ->> 'readOnly')::boolean, false);
    END IF;
    UPDATE streamd.streams s SET read_only = v_ro
     WHERE s.stream_name = CASE TG_OP WHEN 'DELETE' THEN OLD.stream_name ELSE NEW.stream_name END
       AND s.read_only IS DISTINCT FROM v_ro;
    RETURN NULL;
END;
$$;

-- Raises SD005 for an append to a read-only stream.
CREATE OR REPLACE FUNCTION streamd.raise_read_only(p_stream_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'SD005',
        MESSAGE = format('stream %L is read-only (lifecycle_config.readOnly): appends are refused', p_stream_name);
END;
$$;

CREATE OR REPLACE TRIGGER stream_configurations_lifecycle
    AFTER INSERT OR UPDATE OR DELETE ON streamd.stream_configurations
    FOR EACH ROW EXECUTE FUNCTION streamd.stream_configurations_lifecycle();

-- lifecycle_config.archiveAfter and deleteAfter (the coordinator's leader calls this
-- through streamconfig.ApplyLifecycle every retention interval). A stream is idle
-- since its last append (the latest last_appended_at of its partitions), or its
-- creation when it has none. At p_now (NULL: now()):
--   - a stream idle for deleteAfter is returned with action 'delete' (the caller
--     deletes it, with its read indexes, through streams.Client.DeleteStream);
--   - else a stream idle for archiveAfter and not yet read-only is archived: its
--     lifecycle_config gets "readOnly": true (so it refuses appends from now on,
--     and an operator sees why), and it is returned with action 'archive'.
CREATE OR REPLACE FUNCTION streamd.apply_lifecycle(p_now timestamptz)
RETURNS TABLE (stream_name text, action text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := coalesce(p_now, now());
    r          record;
    v_archive  bigint;
    v_delete   bigint;
BEGIN
    FOR r IN
        SELECT c.stream_name AS s, s.read_only,
               coalesce(max(h.last_appended_at), s.created_at) AS last_at,
               c.lifecycle_config AS cfg
          FROM streamd.stream_configurations c
          JOIN streamd.streams s ON s.stream_name = c.stream_name
          LEFT JOIN streamd.stream_partitions h ON h.stream_name = c.stream_name
         WHERE c.lifecycle_config ? 'archiveAfter' OR c.lifecycle_config ? 'deleteAfter'
         GROUP BY c.stream_name, s.read_only, s.created_at, c.lifecycle_config
         ORDER BY c.stream_name
    LOOP
        -- A configuration stored before its keys were checked (an upgrade) may not
        -- parse: that stream is skipped with a warning, the others go on.
        BEGIN
            v_archive := streamd.config_duration_seconds('lifecycle_config.archiveAfter', r.cfg -> 'archiveAfter');
            v_delete  := streamd.config_duration_seconds('lifecycle_config.deleteAfter', r.cfg -> 'deleteAfter');
        EXCEPTION WHEN SQLSTATE 'SD301' THEN
            RAISE WARNING 'lifecycle of stream %: % (skipped)', r.s, SQLERRM;
            CONTINUE;
        END;
        IF v_delete IS NOT NULL AND r.last_at + v_delete * interval '1 second' <= v_now THEN
            stream_name := r.s;
            action := 'delete';
            RETURN NEXT;
        ELSIF v_archive IS NOT NULL AND NOT r.read_only AND r.last_at + v_archive * interval '1 second' <= v_now THEN
            UPDATE streamd.stream_configurations c
               SET lifecycle_config = c.lifecycle_config || '{"readOnly": true}'
             WHERE c.stream_name = r.s;
            stream_name := r.s;
            action := 'archive';
            RETURN NEXT;
        END IF;
    END LOOP;
END;
$$;
