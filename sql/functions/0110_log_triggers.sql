-- L3: a plain INSERT INTO streamd.events from any SQL client or trigger gets a correct
-- offset. The row trigger validates the row, routes it (key hash, else one partition
-- per transaction), and takes its offset from the partition's head row, whatever offset
-- the INSERT named. streamd.append() reserves offsets for a whole batch itself and
-- marks the rows it inserts as trusted for the duration of its own statement only.
--
-- A duplicate event_id already committed is skipped (the INSERT reports 0 rows for it,
-- L4). Caveat: an INSERT ... ON CONFLICT DO NOTHING that meets a concurrent, not yet
-- committed duplicate leaves a one-offset hole; use streamd.append() for retried
-- batches, which closes such holes.
CREATE OR REPLACE FUNCTION streamd.events_before_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_stream streamd.streams%ROWTYPE;
    v_size   integer;
BEGIN
    SELECT * INTO v_stream FROM streamd.streams s WHERE s.stream_name = NEW.stream_name;
    IF NOT FOUND THEN
        PERFORM streamd.raise_partition_missing(NEW.stream_name, coalesce(NEW.partition, 0));
    END IF;
    IF NEW.partition IS NULL THEN
        IF NEW.key IS NOT NULL THEN
            NEW.partition := streamd.partition_for_key(NEW.key, v_stream.partitions);
        ELSE
            NEW.partition := (pg_current_xact_id()::text::bigint % v_stream.partitions)::integer;
        END IF;
    ELSIF NEW.partition < 0 OR NEW.partition >= v_stream.partitions THEN
        RAISE EXCEPTION USING ERRCODE = 'SD002',
            MESSAGE = format('stream %L has no partition %s (it has %s)', NEW.stream_name, NEW.partition, v_stream.partitions);
    END IF;
    v_size := coalesce(octet_length(NEW.data::text), 0) + coalesce(octet_length(NEW.data_bytes), 0);
    IF v_size > v_stream.max_payload_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'SD004',
            MESSAGE = format('payload of %s bytes exceeds the limit of %s bytes of stream %L', v_size, v_stream.max_payload_bytes, NEW.stream_name);
    END IF;
    IF NEW.event_id IS NULL THEN
        NEW.event_id := gen_random_uuid()::text;
    ELSIF EXISTS (SELECT 1 FROM streamd.events e WHERE e.stream_name = NEW.stream_name AND e.event_id = NEW.event_id) THEN
        RETURN NULL;
    END IF;
    IF NEW.event_type IS NULL THEN
        NEW.event_type := '';
    END IF;
    IF NEW.version IS NULL THEN
        NEW.version := 1;
    END IF;
    UPDATE streamd.stream_partitions h
       SET next_offset = h.next_offset + 1,
           last_appended_at = greatest(clock_timestamp(), h.last_appended_at)
     WHERE h.stream_name = NEW.stream_name AND h.partition = NEW.partition
    RETURNING h.next_offset - 1, h.last_appended_at INTO NEW."offset", NEW."timestamp";
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SD002',
            MESSAGE = format('stream %L has no partition %s', NEW.stream_name, NEW.partition);
    END IF;
    RETURN NEW;
END;
$$;

-- The log is append-only: an event's position and content never change.
CREATE OR REPLACE FUNCTION streamd.events_before_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'SD005',
        MESSAGE = format('events are append-only: cannot update %s/%s@%s', OLD.stream_name, OLD.partition, OLD."offset");
END;
$$;

CREATE OR REPLACE TRIGGER events_assign_offset
    BEFORE INSERT ON streamd.events
    FOR EACH ROW
    WHEN (current_setting('streamd.append_trusted', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION streamd.events_before_insert();

CREATE OR REPLACE TRIGGER events_append_only
    BEFORE UPDATE ON streamd.events
    FOR EACH ROW
    WHEN (current_setting('streamd.append_trusted', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION streamd.events_before_update();
