-- stream_configurations.retention_config <-> retention_policies. Applied idempotently.
--
-- retention_policies is what retention executes; retention_config is the same settings
-- as seed 003's JSON. A write to either is mirrored to the other by the triggers below
-- in the same statement, so they never disagree in a committed state. The mirrored
-- write marks itself with the transaction-local setting streamd.retention_sync so the
-- other side's trigger does not echo it back.
--
-- retention_config keys (camelCase, as in the seed; unknown keys are refused, SD301):
--   enabled             boolean, default true
--   maxAge              duration: .NET TimeSpan "d.hh:mm:ss[.fffffff]" or "hh:mm:ss",
--                       a Go duration "2160h30m", or a number of seconds; whole
--                       seconds (a fraction is refused, as in Go), 1s to 68 years
--   maxEventCount       integer >= 0, per partition (an integral 5.0 is 5)
--   maxSizeBytes        integer >= 0, per partition (stored payload bytes)
--   cleanupPolicy       "delete" (default), "compact" or "compact,delete"
--   tombstoneRetention  duration, whole seconds, 0 to 68 years, default "1.00:00:00"
--   protectConsumers    boolean, default false

-- Seconds in a duration given as JSON (see above). p_field names the value in errors.
-- Durations are whole seconds, as Go's streamconfig.Validate requires: a fraction is
-- refused (SD301), not cut off (a "500ms" tombstoneRetention was stored as 0). The sum
-- is kept in numeric and range-checked before the cast, so a huge value is SD301 naming
-- the field, not "bigint out of range". Every caller stores integer seconds, so the
-- range is that of integer (about 68 years).
CREATE OR REPLACE FUNCTION streamd.config_duration_seconds(p_field text, p_value jsonb) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_text  text;
    m       text[];
    v_total numeric := 0;
BEGIN
    IF p_value IS NULL OR jsonb_typeof(p_value) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) = 'number' THEN
        v_total := p_value::numeric;
        IF v_total < 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'SD301',
                MESSAGE = format('%s: %s must not be negative', p_field, p_value);
        END IF;
    ELSIF jsonb_typeof(p_value) <> 'string' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301',
            MESSAGE = format('%s: %s is not a duration (use "d.hh:mm:ss", a Go duration such as "720h", or seconds)', p_field, p_value);
    ELSE
        v_text := p_value #>> '{}';
        -- .NET TimeSpan, constant format: [d.]hh:mm:ss[.fffffff]
        m := regexp_match(v_text, '^(?:([0-9]+)\.)?([0-9]{1,2}):([0-9]{1,2}):([0-9]{1,2})(?:\.([0-9]{1,7}))?$');
        IF m IS NOT NULL THEN
            IF m[2]::integer > 23 OR m[3]::integer > 59 OR m[4]::integer > 59 THEN
                RAISE EXCEPTION USING ERRCODE = 'SD301',
                    MESSAGE = format('%s: %L has hours over 23 or minutes or seconds over 59', p_field, v_text);
            END IF;
            v_total := coalesce(m[1]::numeric, 0) * 86400 + m[2]::numeric * 3600 + m[3]::numeric * 60 + m[4]::numeric
                       + coalesce(('0.' || m[5])::numeric, 0);
        -- Go duration: a sequence of decimal numbers with units.
        ELSIF v_text ~ '^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$' THEN
            FOR m IN SELECT regexp_matches(v_text, '([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)', 'g') LOOP
                v_total := v_total + m[1]::numeric * CASE m[2]
                    WHEN 'h' THEN 3600 WHEN 'm' THEN 60 WHEN 's' THEN 1 WHEN 'ms' THEN 0.001
                    WHEN 'us' THEN 0.000001 WHEN 'µs' THEN 0.000001 ELSE 0.000000001 END;
            END LOOP;
        ELSE
            RAISE EXCEPTION USING ERRCODE = 'SD301',
                MESSAGE = format('%s: %L is not a duration (use "d.hh:mm:ss", a Go duration such as "720h", or seconds)', p_field, v_text);
        END IF;
    END IF;
    IF v_total <> trunc(v_total) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301',
            MESSAGE = format('%s: %s must be a whole number of seconds', p_field, p_value);
    END IF;
    IF v_total > 2147483647 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301',
            MESSAGE = format('%s: %s is over 68 years', p_field, p_value);
    END IF;
    RETURN v_total::bigint;
END;
$$;

-- A duration in seconds as a .NET TimeSpan string, the seed's form: "90.00:00:00".
CREATE OR REPLACE FUNCTION streamd.config_timespan(p_seconds bigint) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT CASE WHEN p_seconds >= 86400 THEN (p_seconds / 86400)::text || '.' ELSE '' END
        || lpad(((p_seconds % 86400) / 3600)::text, 2, '0') || ':'
        || lpad(((p_seconds % 3600) / 60)::text, 2, '0') || ':'
        || lpad((p_seconds % 60)::text, 2, '0')
$$;

-- The policy that a retention_config object describes (SD301 naming the key when it
-- is not valid).
CREATE OR REPLACE FUNCTION streamd.retention_policy_from_config(p_stream_name text, p_config jsonb)
RETURNS streamd.retention_policies
LANGUAGE plpgsql AS $$
DECLARE
    p     streamd.retention_policies;
    v_key text;
    v_age bigint;
    v_tomb bigint;
BEGIN
    IF p_config IS NULL OR jsonb_typeof(p_config) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301', MESSAGE = 'retention_config: must be a JSON object';
    END IF;
    SELECT k INTO v_key FROM jsonb_object_keys(p_config) k
     WHERE k NOT IN ('enabled', 'maxAge', 'maxEventCount', 'maxSizeBytes', 'cleanupPolicy', 'tombstoneRetention', 'protectConsumers')
     ORDER BY k LIMIT 1;
    IF v_key IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301', MESSAGE = format('retention_config.%s: unknown key', v_key);
    END IF;
    FOREACH v_key IN ARRAY ARRAY['enabled', 'protectConsumers'] LOOP
        IF p_config ? v_key AND jsonb_typeof(p_config -> v_key) NOT IN ('boolean', 'null') THEN
            RAISE EXCEPTION USING ERRCODE = 'SD301', MESSAGE = format('retention_config.%s: must be true or false', v_key);
        END IF;
    END LOOP;
    FOREACH v_key IN ARRAY ARRAY['maxEventCount', 'maxSizeBytes'] LOOP
        IF p_config ? v_key AND jsonb_typeof(p_config -> v_key) <> 'null'
           AND (jsonb_typeof(p_config -> v_key) <> 'number'
                OR (p_config ->> v_key)::numeric < 0
                OR (p_config ->> v_key)::numeric <> trunc((p_config ->> v_key)::numeric)
                OR (p_config ->> v_key)::numeric > CASE v_key WHEN 'maxEventCount' THEN 2147483647 ELSE 9223372036854775807 END) THEN
            RAISE EXCEPTION USING ERRCODE = 'SD301',
                MESSAGE = format('retention_config.%s: %s is not a non-negative whole number in range', v_key, p_config -> v_key);
        END IF;
    END LOOP;
    IF p_config ? 'cleanupPolicy' AND jsonb_typeof(p_config -> 'cleanupPolicy') <> 'null'
       AND coalesce(p_config ->> 'cleanupPolicy', '') NOT IN ('delete', 'compact', 'compact,delete') THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301',
            MESSAGE = format('retention_config.cleanupPolicy: %s is not "delete", "compact" or "compact,delete"', p_config -> 'cleanupPolicy');
    END IF;
    v_age := streamd.config_duration_seconds('retention_config.maxAge', p_config -> 'maxAge');
    IF v_age IS NOT NULL AND (v_age < 1 OR v_age > 2147483647) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301',
            MESSAGE = format('retention_config.maxAge: %s must be between 1 second and 68 years', p_config -> 'maxAge');
    END IF;
    v_tomb := streamd.config_duration_seconds('retention_config.tombstoneRetention', p_config -> 'tombstoneRetention');
    IF v_tomb IS NOT NULL AND v_tomb > 2147483647 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301',
            MESSAGE = format('retention_config.tombstoneRetention: %s is over 68 years', p_config -> 'tombstoneRetention');
    END IF;

    p.stream_name := p_stream_name;
    p.enabled := coalesce((p_config ->> 'enabled')::boolean, true);
    p.max_age_seconds := v_age;
    -- Through numeric: an integral 5.0 is 5 (checked above), and is stored as 5.
    p.max_event_count := (p_config ->> 'maxEventCount')::numeric::integer;
    p.max_size_bytes := (p_config ->> 'maxSizeBytes')::numeric::bigint;
    p.cleanup_policy := coalesce(p_config ->> 'cleanupPolicy', 'delete');
    p.tombstone_retention_seconds := coalesce(v_tomb, 86400);
    p.protect_consumers := coalesce((p_config ->> 'protectConsumers')::boolean, false);
    RETURN p;
END;
$$;

-- The retention_config object of a policy row, in canonical form (durations as
-- TimeSpan strings, absent limits omitted).
CREATE OR REPLACE FUNCTION streamd.retention_config_json(p streamd.retention_policies) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'enabled', p.enabled,
        'maxAge', streamd.config_timespan(p.max_age_seconds),
        'maxEventCount', p.max_event_count,
        'maxSizeBytes', p.max_size_bytes,
        'cleanupPolicy', p.cleanup_policy,
        'tombstoneRetention', streamd.config_timespan(p.tombstone_retention_seconds),
        'protectConsumers', p.protect_consumers))
$$;

-- Raises SD301 when a configuration section is neither NULL nor a JSON object.
CREATE OR REPLACE FUNCTION streamd.config_check_section(p_name text, p_value jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NOT NULL AND jsonb_typeof(p_value) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301', MESSAGE = format('%s: must be a JSON object, got %s', p_name, p_value);
    END IF;
END;
$$;

-- stream_configurations, before the write: validates retention_config and stores it
-- in canonical form. It writes nothing else: PostgreSQL fires BEFORE INSERT row
-- triggers before the ON CONFLICT check, so a policy written here would be written
-- for an INSERT that then does nothing (ON CONFLICT DO NOTHING) or becomes an UPDATE
-- of other columns (ON CONFLICT DO UPDATE SET tags = ...). The policy is mirrored by
-- stream_configurations_after_write, which fires only for the action taken.
CREATE OR REPLACE FUNCTION streamd.stream_configurations_before_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        NEW.updated_at := now();
    END IF;
    IF current_setting('streamd.retention_sync', true) = 'on' THEN
        RETURN NEW;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM streamd.streams s WHERE s.stream_name = NEW.stream_name) THEN
        PERFORM streamd.raise_partition_missing(NEW.stream_name, 0);
    END IF;
    -- The other sections' shape, which every reader (streamconfig.Get, the API's
    -- access checks) relies on: JSON objects, and tags of string values. The
    -- dead-letter, lifecycle and performance keys are checked here for every door
    -- (sql/functions/0420_stream_settings.sql): an unknown key is refused.
    PERFORM streamd.config_check_settings(NEW.dead_letter_config, NEW.lifecycle_config, NEW.performance_config),
            streamd.config_check_section('access_control_config', NEW.access_control_config),
            streamd.config_check_section('tags', NEW.tags);
    IF NEW.tags IS NOT NULL AND EXISTS (SELECT 1 FROM jsonb_each(NEW.tags) t WHERE jsonb_typeof(t.value) <> 'string') THEN
        RAISE EXCEPTION USING ERRCODE = 'SD301',
            MESSAGE = format('tags: every value must be a string, got %s', NEW.tags);
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.retention_config IS NOT DISTINCT FROM OLD.retention_config THEN
        RETURN NEW;
    END IF;
    IF NEW.retention_config IS NOT NULL THEN
        NEW.retention_config := streamd.retention_config_json(
            streamd.retention_policy_from_config(NEW.stream_name, NEW.retention_config));
    END IF;
    RETURN NEW;
END;
$$;

-- stream_configurations, after the write: mirrors the row's retention_config (valid
-- and canonical by now) into retention_policies, in the same statement.
CREATE OR REPLACE FUNCTION streamd.stream_configurations_after_write() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    p streamd.retention_policies;
BEGIN
    IF current_setting('streamd.retention_sync', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.retention_config IS NOT DISTINCT FROM OLD.retention_config THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('streamd.retention_sync', 'on', true);
    IF NEW.retention_config IS NULL THEN
        DELETE FROM streamd.retention_policies rp WHERE rp.stream_name = NEW.stream_name;
    ELSE
        p := streamd.retention_policy_from_config(NEW.stream_name, NEW.retention_config);
        INSERT INTO streamd.retention_policies AS rp (stream_name, max_age_seconds, max_event_count, enabled, max_size_bytes,
                                                     cleanup_policy, tombstone_retention_seconds, protect_consumers)
        VALUES (p.stream_name, p.max_age_seconds, p.max_event_count, p.enabled, p.max_size_bytes,
                p.cleanup_policy, p.tombstone_retention_seconds, p.protect_consumers)
        ON CONFLICT (stream_name) DO UPDATE
           SET max_age_seconds = EXCLUDED.max_age_seconds, max_event_count = EXCLUDED.max_event_count,
               enabled = EXCLUDED.enabled, max_size_bytes = EXCLUDED.max_size_bytes,
               cleanup_policy = EXCLUDED.cleanup_policy, tombstone_retention_seconds = EXCLUDED.tombstone_retention_seconds,
               protect_consumers = EXCLUDED.protect_consumers, updated_at = now();
    END IF;
    PERFORM set_config('streamd.retention_sync', 'off', true);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION streamd.stream_configurations_after_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('streamd.retention_sync', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('streamd.retention_sync', 'on', true);
    DELETE FROM streamd.retention_policies rp WHERE rp.stream_name = OLD.stream_name;
    PERFORM set_config('streamd.retention_sync', 'off', true);
    RETURN NULL;
END;
$$;

-- retention_policies: a direct write (seed-style SQL) is mirrored into
-- stream_configurations.retention_config.
CREATE OR REPLACE FUNCTION streamd.retention_policies_after_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('streamd.retention_sync', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('streamd.retention_sync', 'on', true);
    IF TG_OP = 'DELETE' THEN
        UPDATE streamd.stream_configurations c SET retention_config = NULL WHERE c.stream_name = OLD.stream_name;
    ELSE
        INSERT INTO streamd.stream_configurations AS c (stream_name, retention_config)
        VALUES (NEW.stream_name, streamd.retention_config_json(NEW))
        ON CONFLICT (stream_name) DO UPDATE SET retention_config = EXCLUDED.retention_config;
    END IF;
    PERFORM set_config('streamd.retention_sync', 'off', true);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION streamd.retention_policies_before_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER stream_configurations_sync
    BEFORE INSERT OR UPDATE ON streamd.stream_configurations
    FOR EACH ROW EXECUTE FUNCTION streamd.stream_configurations_before_write();

CREATE OR REPLACE TRIGGER stream_configurations_sync_write
    AFTER INSERT OR UPDATE ON streamd.stream_configurations
    FOR EACH ROW EXECUTE FUNCTION streamd.stream_configurations_after_write();

CREATE OR REPLACE TRIGGER stream_configurations_sync_delete
    AFTER DELETE ON streamd.stream_configurations
    FOR EACH ROW EXECUTE FUNCTION streamd.stream_configurations_after_delete();

CREATE OR REPLACE TRIGGER retention_policies_sync
    AFTER INSERT OR UPDATE OR DELETE ON streamd.retention_policies
    FOR EACH ROW EXECUTE FUNCTION streamd.retention_policies_after_write();

CREATE OR REPLACE TRIGGER retention_policies_touch
    BEFORE UPDATE ON streamd.retention_policies
    FOR EACH ROW EXECUTE FUNCTION streamd.retention_policies_before_update();
