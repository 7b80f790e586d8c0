-- Seed 003's own SQL against streamd's tables (issue 20, point 1): triggers that give
-- the seed's plain INSERTs streamd's meaning, checks and defaults. Migration 0060 made
-- the columns they rely on. Applied idempotently on every migrate.

-- Seed 003's offset commit, unchanged:
--   INSERT INTO consumer_offsets (stream_name, group_id, consumer_id, "offset") VALUES (...)
--   ON CONFLICT (stream_name, group_id, consumer_id) DO UPDATE SET "offset" = EXCLUDED."offset", updated_at = NOW()
-- names no partition. The seed's model is a stream of one partition, and for such a
-- stream the row means "the group's next offset to read is this, committed by this
-- consumer": the trigger resolves the partition (0), checks the offset like
-- commit_offsets (SD105: 0 to the log end), creates the group when there is none
-- (SD001 for an unknown stream, SD103 for an invalid group id) and stores it. For a
-- stream of several partitions it refuses (SD105) and names the per-partition form.
--
-- The row is written by the trigger itself (ON CONFLICT on the partition, the
-- table's key), and the INSERT reports 0 rows: the statement's own conflict target
-- (the consumer) cannot find the group's row when another consumer, or the library,
-- committed it last. So the seed form always upserts, whatever its ON CONFLICT says.
-- It is not fenced (G1): it is an operator's or a seed program's write, like
-- reset_offsets without a member; a live member's next commit overwrites it.
-- The seed's "get consumer position" query then answers for that consumer; the
-- library's commits keep the seed consumer's name on the row (they set committed_by,
-- not consumer_id), so the query follows the group as it progresses.
CREATE OR REPLACE FUNCTION streamd.consumer_offsets_seed_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_parts integer;
BEGIN
    PERFORM streamd.cg_lock_group(NEW.stream_name, NEW.group_id, true);
    SELECT s.partitions INTO v_parts FROM streamd.streams s WHERE s.stream_name = NEW.stream_name;
    IF v_parts <> 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('stream %L has %s partitions: an offset commit without a partition (seed 003''s form) is for a stream of one; commit per partition: INSERT INTO streamd.consumer_offsets (stream_name, group_id, partition, "offset") VALUES (...) ON CONFLICT (stream_name, group_id, partition) DO UPDATE SET "offset" = EXCLUDED."offset", updated_at = now()',
                             NEW.stream_name, v_parts);
    END IF;
    IF NEW.consumer_id IS NULL OR NEW.consumer_id = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('an offset commit without a partition (seed 003''s form) needs a consumer_id (stream %L, group %L)',
                             NEW.stream_name, NEW.group_id);
    END IF;
    PERFORM streamd.cg_check_offsets(NEW.stream_name, ARRAY[0], ARRAY[NEW."offset"]);
    -- A consumer that committed before under another row cannot be: the stream has one
    -- partition, so one row per group.
    INSERT INTO streamd.consumer_offsets AS co (stream_name, group_id, partition, "offset", consumer_id, committed_by,
                                                member_epoch, metadata, updated_at)
    VALUES (NEW.stream_name, NEW.group_id, 0, NEW."offset", NEW.consumer_id, NEW.consumer_id, NULL, NEW.metadata, now())
    ON CONFLICT (stream_name, group_id, partition) DO UPDATE
       SET "offset" = EXCLUDED."offset", consumer_id = EXCLUDED.consumer_id, committed_by = EXCLUDED.committed_by,
           member_epoch = NULL, metadata = EXCLUDED.metadata, updated_at = EXCLUDED.updated_at;
    RETURN NULL;
END;
$$;

-- A plain per-partition INSERT (consumer_id or not, no committed_by: the library sets
-- it) is checked as commit_offsets checks: the partition and offset exist in the log
-- (SD105), and the group is created when missing.
CREATE OR REPLACE FUNCTION streamd.consumer_offsets_plain_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM streamd.cg_lock_group(NEW.stream_name, NEW.group_id, true);
    PERFORM streamd.cg_check_offsets(NEW.stream_name, ARRAY[NEW.partition], ARRAY[NEW."offset"]);
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER consumer_offsets_seed_form
    BEFORE INSERT ON streamd.consumer_offsets
    FOR EACH ROW
    WHEN (NEW.partition IS NULL)
    EXECUTE FUNCTION streamd.consumer_offsets_seed_insert();

CREATE OR REPLACE TRIGGER consumer_offsets_plain
    BEFORE INSERT ON streamd.consumer_offsets
    FOR EACH ROW
    WHEN (NEW.partition IS NOT NULL AND NEW.committed_by IS NULL)
    EXECUTE FUNCTION streamd.consumer_offsets_plain_insert();

-- Whether p_id is a dedup key of a message of p_queue that the calling role cannot
-- see (another tenant's). SECURITY DEFINER: it reads past row-level security, and
-- says only yes or no, as queue_send's refusal does.
-- p_tenant is the caller's tenant (streamd.current_tenant() of the caller: inside
-- this function current_user is its owner).
CREATE OR REPLACE FUNCTION streamd.queue_message_id_hidden(p_queue text, p_id text, p_tenant text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM streamd.queue_messages m
                    WHERE m.message_id = p_id AND m.stream_name = p_queue AND m.dedup
                      AND m.tenant_id IS DISTINCT FROM p_tenant)
$$;

-- A plain INSERT INTO streamd.messages (seed 003's table, since migration 0086 a view
-- of streamd.queue_messages; an INSERT of the application's or of its trigger) goes
-- through what queue_send does for the same message, and this INSTEAD OF trigger
-- stores it:
--   - the queue must exist: SD201 (SD202 for an invalid name), nothing written;
--   - the queue's settings apply to what the insert leaves out: max_delivery_attempts
--     and dead_letter_stream (the seed's columns) are then the queue's (stored as
--     NULL, read through the view as the queue's values); a value given is checked
--     as Send's per-message overrides are (SD204) and stored as the message's;
--   - the payload limit (SD203), message id (1 to 512 characters) and FIFO group key
--     rules (SD204) hold; a FIFO message gets its group row (message_groups), without
--     which it would never be delivered;
--   - dedup: a message id the queue holds is skipped (the INSERT reports 0 rows for
--     it), as Send reports a duplicate; an id held by a message this role cannot see
--     (another tenant's) is refused with SD204, as by queue_send. A NULL message_id
--     gets a random UUID that is no dedup key (Send's made ids);
--   - a visibility_timeout given (the seed's "visible again at") delays the message;
--     NULL means now, as in the seed;
--   - offsets come from the queue's sequence whatever the insert named, and leases,
--     attempts and dead-letter provenance are the queue's own to write (SD204).
-- queue_send, queue_dead_letter and queue_redrive do all this themselves for whole
-- batches and insert into streamd.queue_messages, which has no trigger. Like any
-- direct write to queue_messages, a role with INSERT on it can skip these checks: a
-- guard against mistakes, not against a hostile role (docs/tenants.md, Limits).
-- The INSERT reports the row (RETURNING sees its offset), or 0 rows for a duplicate.
CREATE OR REPLACE FUNCTION streamd.messages_before_insert() RETURNS trigger
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_q    streamd.queues;
    v_size bigint;
    v_now  timestamptz := statement_timestamp();
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1396986164, hashtext(NEW.stream_name)); -- see queue_lock_shared
    v_q := streamd.queue_get(NEW.stream_name);
    IF NEW.lease_token IS NOT NULL OR coalesce(NEW.delivery_attempts, 0) <> 0 OR NEW.origin_stream IS NOT NULL
       OR NEW.origin_offset IS NOT NULL OR NEW.origin_attempts IS NOT NULL OR NEW.dead_lettered_at IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: an insert cannot set lease_token, delivery_attempts or dead-letter provenance (origin_*, dead_lettered_at): the queue writes them',
                             NEW.stream_name);
    END IF;
    IF (NEW.data IS NULL) = (NEW.data_bytes IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: a message needs data (JSON) or data_bytes, exactly one', NEW.stream_name);
    END IF;
    v_size := coalesce(octet_length(NEW.data::text), octet_length(NEW.data_bytes)) + coalesce(octet_length(NEW.metadata::text), 0);
    IF v_size > v_q.max_payload_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'SD203',
            MESSAGE = format('queue %L: message is %s bytes with its headers; the queue allows %s', NEW.stream_name, v_size, v_q.max_payload_bytes);
    END IF;
    IF NEW.metadata IS NOT NULL AND jsonb_typeof(NEW.metadata) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: metadata (the headers) must be a JSON object, not %s', NEW.stream_name, jsonb_typeof(NEW.metadata));
    END IF;
    IF NEW.max_delivery_attempts < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: max delivery attempts %s must be at least 1', NEW.stream_name, NEW.max_delivery_attempts);
    END IF;
    IF NEW.dead_letter_stream IS NULL THEN
        NULL; -- the queue's
    ELSIF NEW.dead_letter_stream = NEW.stream_name THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204', MESSAGE = format('queue %L cannot be its own dead-letter queue', NEW.stream_name);
    ELSIF (streamd.queue_get(NEW.dead_letter_stream)).fifo THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('dead-letter queue %L is FIFO; it must be standard', NEW.dead_letter_stream);
    END IF;
    IF v_q.fifo AND (NEW.group_key IS NULL OR NEW.group_key = '' OR length(NEW.group_key) > 512) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: a FIFO queue needs a group key of 1 to 512 characters', NEW.stream_name);
    ELSIF NOT v_q.fifo AND NEW.group_key IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204', MESSAGE = format('queue %L: a group key needs a FIFO queue', NEW.stream_name);
    END IF;

    IF NEW.message_id IS NULL THEN
        NEW.message_id := gen_random_uuid()::text;
        NEW.dedup := false;
    ELSIF NEW.message_id = '' OR length(NEW.message_id) > 512 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: message id must be 1 to 512 characters', NEW.stream_name);
    ELSIF NEW.dedup THEN
        PERFORM 1 FROM streamd.queue_messages m
         WHERE m.message_id = NEW.message_id AND m.stream_name = NEW.stream_name AND m.dedup;
        IF FOUND THEN
            RETURN NULL;
        END IF;
        IF row_security_active('streamd.queue_messages'::regclass) AND streamd.queue_message_id_hidden(NEW.stream_name, NEW.message_id, streamd.current_tenant()) THEN
            RAISE EXCEPTION USING ERRCODE = 'SD204',
                MESSAGE = format('queue %L: message id %L is already used in this queue by a message this role cannot see (another tenant''s)',
                                 NEW.stream_name, NEW.message_id);
        END IF;
    END IF;

    NEW.enqueued_at := v_now;
    NEW.visibility_timeout := greatest(coalesce(NEW.visibility_timeout, v_now), v_now);

    IF v_q.fifo THEN
        -- The group row, as queue_send makes it (locked, so that sends to one group
        -- commit one at a time).
        INSERT INTO streamd.message_groups AS g (stream_name, group_key, tenant_id, visible_at)
        VALUES (NEW.stream_name, NEW.group_key, coalesce(NEW.tenant_id, ''), NEW.visibility_timeout)
        ON CONFLICT (stream_name, group_key, tenant_id) DO UPDATE SET visible_at = g.visible_at;
    END IF;
    NEW."offset" := nextval(v_q.offset_seq); -- after the group lock: offsets in a group follow commit order
    INSERT INTO streamd.queue_messages (stream_name, "offset", enqueued_at, visibility_timeout, dedup, message_id, data,
                                        data_bytes, tenant_id, group_key, metadata, max_delivery_attempts,
                                        dead_letter_stream)
    VALUES (NEW.stream_name, NEW."offset", NEW.enqueued_at, NEW.visibility_timeout, NEW.dedup, NEW.message_id, NEW.data,
            NEW.data_bytes, NEW.tenant_id, NEW.group_key, NEW.metadata, NEW.max_delivery_attempts, NEW.dead_letter_stream);
    -- What the view shows for the row.
    NEW.delivery_attempts := 0;
    NEW.not_before := NEW.visibility_timeout;
    NEW.max_delivery_attempts := coalesce(NEW.max_delivery_attempts, v_q.max_delivery_attempts);
    NEW.dead_letter_stream := coalesce(NEW.dead_letter_stream, v_q.dead_letter_queue);
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER messages_plain_insert
    INSTEAD OF INSERT ON streamd.messages
    FOR EACH ROW
    EXECUTE FUNCTION streamd.messages_before_insert();
