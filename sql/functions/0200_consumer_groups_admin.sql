-- Consumer group administration: offset resets, group deletion, pause/resume and the
-- dead letter queue. Error codes as in 0200_consumer_groups.sql.

-- True when the group has a member whose session has not expired at p_now.
CREATE OR REPLACE FUNCTION streamd.cg_has_live_members(p_stream_name text, p_group_id text, p_now timestamptz)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM streamd.consumer_registrations cr
                    WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id
                      AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= p_now)
$$;

-- Resets a group's committed offsets (kafka-consumer-groups --reset-offsets).
-- p_mode: 'earliest' (log start), 'latest' (log end), 'timestamp' (first event at or
-- after p_time), 'offset' (p_value, clamped to the partition's stored range), 'shift'
-- (committed offset, or the log start when none, plus p_value, clamped).
-- p_partitions NULL means all; an empty array means none: nothing is reset and, even
-- with p_force, nobody is expelled. Refused (SD104) while the group has live members,
-- unless p_force, which expels them first (fencing their commits; they join again and
-- start from the new offsets). Returns each partition's previous and new offset.
CREATE OR REPLACE FUNCTION streamd.reset_group_offsets(
    p_stream_name text,
    p_group_id    text,
    p_mode        text,
    p_value       bigint,
    p_time        timestamptz,
    p_partitions  integer[],
    p_force       boolean,
    p_now         timestamptz
) RETURNS TABLE (partition integer, previous_offset bigint, new_offset bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz;
    v_bad  integer;
    v_new  bigint;
    v_report jsonb := '[]';
    r      record;
BEGIN
    IF p_mode IS NULL OR p_mode NOT IN ('earliest', 'latest', 'timestamp', 'offset', 'shift') THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('reset offsets: mode %L: want earliest, latest, timestamp, offset or shift', p_mode);
    END IF;
    IF p_mode = 'timestamp' AND p_time IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105', MESSAGE = 'reset offsets: mode timestamp needs a time';
    END IF;
    IF p_mode IN ('offset', 'shift') AND p_value IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105', MESSAGE = format('reset offsets: mode %s needs a value', p_mode);
    END IF;
    IF p_mode = 'offset' AND p_value < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105', MESSAGE = format('reset offsets: offset %s is negative', p_value);
    END IF;
    PERFORM streamd.cg_lock_group(p_stream_name, p_group_id, false);
    v_now := coalesce(p_now, clock_timestamp()); -- after the lock (the clock rule)
    IF cardinality(p_partitions) = 0 THEN
        RETURN; -- no partition to reset: nothing to expel the members for
    END IF;
    SELECT min(u.p) INTO v_bad FROM unnest(p_partitions) AS u(p)
     WHERE NOT EXISTS (SELECT 1 FROM streamd.stream_partitions h WHERE h.stream_name = p_stream_name AND h.partition = u.p);
    IF v_bad IS NOT NULL OR array_position(p_partitions, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('reset offsets: stream %L has no partition %s', p_stream_name, coalesce(v_bad::text, 'NULL'));
    END IF;

    PERFORM streamd.cg_expire(p_stream_name, p_group_id, v_now);
    IF streamd.cg_has_live_members(p_stream_name, p_group_id, v_now) THEN
        IF NOT coalesce(p_force, false) THEN
            RAISE EXCEPTION USING ERRCODE = 'SD104',
                MESSAGE = format('group %L of stream %L has live members; stop them or force the reset', p_group_id, p_stream_name);
        END IF;
    END IF;
    IF coalesce(p_force, false) THEN
        FOR r IN SELECT cr.consumer_id FROM streamd.consumer_registrations cr
                  WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id ORDER BY cr.consumer_id FOR UPDATE LOOP
            -- Waiting (p_wait): the reset must not pass the members' in-flight
            -- commits, whose offsets it overwrites.
            PERFORM streamd.advise_member_gone(p_stream_name, p_group_id, r.consumer_id, 'offsets_reset', v_now);
            PERFORM streamd.cg_drop_member(p_stream_name, p_group_id, r.consumer_id, v_now, true);
        END LOOP;
        UPDATE streamd.consumer_groups g SET group_epoch = g.group_epoch + 1, updated_at = v_now
         WHERE g.stream_name = p_stream_name AND g.group_id = p_group_id;
        PERFORM pg_notify(streamd.cg_channel(p_stream_name, p_group_id), 'reset');
    END IF;

    FOR r IN SELECT h.partition AS p, h.log_start_offset AS lo, h.next_offset AS hi, co."offset" AS cur
               FROM streamd.stream_partitions h
               LEFT JOIN streamd.consumer_offsets co
                 ON co.stream_name = h.stream_name AND co.group_id = p_group_id AND co.partition = h.partition
              WHERE h.stream_name = p_stream_name AND (p_partitions IS NULL OR h.partition = ANY (p_partitions))
              ORDER BY h.partition LOOP
        -- The shift is added as numeric and clamped before it becomes a bigint again:
        -- a shift near the bigint range (say "to the end": 2^63-1) must clamp, not
        -- overflow.
        v_new := CASE p_mode
                     WHEN 'earliest'  THEN r.lo
                     WHEN 'latest'    THEN r.hi
                     WHEN 'timestamp' THEN streamd.offset_for_time(p_stream_name, r.p, p_time)
                     WHEN 'offset'    THEN p_value
                     ELSE greatest(r.lo, least(r.hi, coalesce(r.cur, r.lo)::numeric + p_value))::bigint
                 END;
        v_new := greatest(r.lo, least(r.hi, v_new));
        INSERT INTO streamd.consumer_offsets AS co (stream_name, group_id, partition, "offset", committed_by, member_epoch, metadata, updated_at)
        VALUES (p_stream_name, p_group_id, r.p, v_new, NULL, NULL, 'reset:' || p_mode, v_now)
        ON CONFLICT (stream_name, group_id, partition) DO UPDATE
           SET "offset" = EXCLUDED."offset", committed_by = NULL, member_epoch = NULL,
               metadata = EXCLUDED.metadata, updated_at = EXCLUDED.updated_at;
        partition := r.p;
        previous_offset := r.cur;
        new_offset := v_new;
        v_report := v_report || jsonb_build_array(jsonb_build_object('partition', r.p, 'previous_offset', r.cur,
                                                                     'new_offset', v_new));
        RETURN NEXT;
    END LOOP;
    PERFORM streamd.advise('streamd.group.offsets_reset', p_stream_name || '/' || p_group_id,
        jsonb_build_object('stream', p_stream_name, 'group', p_group_id, 'mode', p_mode, 'value', p_value,
                           'time', p_time, 'forced', coalesce(p_force, false), 'partitions', v_report, 'at', v_now));
END;
$$;

-- Deletes a group with its members, ownership rows and committed offsets (its dead
-- letters stay). Refused (SD104) while it has live members unless p_force; SD103 for
-- an invalid group id. Returns false when there was no such group. Deleting the
-- ownership rows waits for in-flight commits (their FOR KEY SHARE), as a handover does.
CREATE OR REPLACE FUNCTION streamd.delete_group(p_stream_name text, p_group_id text, p_force boolean, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
    r     record;
BEGIN
    IF NOT streamd.cg_valid_group_id(p_group_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD103',
            MESSAGE = format('invalid group id %L: use 1 to 249 characters of A-Z a-z 0-9 . _ : -', p_group_id);
    END IF;
    PERFORM 1 FROM streamd.consumer_groups g
     WHERE g.stream_name = p_stream_name AND g.group_id = p_group_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_now := coalesce(p_now, clock_timestamp()); -- after the lock (the clock rule)
    IF streamd.cg_has_live_members(p_stream_name, p_group_id, v_now) AND NOT coalesce(p_force, false) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD104',
            MESSAGE = format('group %L of stream %L has live members; stop them or force the delete', p_group_id, p_stream_name);
    END IF;
    FOR r IN SELECT cr.consumer_id FROM streamd.consumer_registrations cr
              WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id
                AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= v_now
              ORDER BY cr.consumer_id LOOP
        PERFORM streamd.advise_member_gone(p_stream_name, p_group_id, r.consumer_id, 'group_deleted', v_now);
    END LOOP;
    DELETE FROM streamd.consumer_groups g WHERE g.stream_name = p_stream_name AND g.group_id = p_group_id;
    PERFORM pg_notify(streamd.cg_channel(p_stream_name, p_group_id), 'delete');
    RETURN true;
END;
$$;

-- Pauses or resumes partitions for the whole group: whichever member owns them stops
-- (or resumes) fetching them, across handovers, until resumed. p_create: a group that
-- does not exist yet is made (a consumer pausing before it joins); without it, an
-- unknown group is SD102 (an operator's typo must not make a group).
CREATE OR REPLACE FUNCTION streamd.set_partitions_paused(p_stream_name text, p_group_id text, p_partitions integer[],
                                                         p_paused boolean, p_create boolean)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_bad integer;
BEGIN
    PERFORM streamd.cg_lock_group(p_stream_name, p_group_id, p_create);
    PERFORM streamd.cg_assign(p_stream_name, p_group_id, clock_timestamp());
    SELECT min(u.p) INTO v_bad FROM unnest(p_partitions) AS u(p)
     WHERE NOT EXISTS (SELECT 1 FROM streamd.consumer_partitions cp
                        WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.partition = u.p);
    IF v_bad IS NOT NULL OR p_partitions IS NULL OR array_position(p_partitions, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('pause: stream %L has no partition %s', p_stream_name, coalesce(v_bad::text, 'NULL'));
    END IF;
    UPDATE streamd.consumer_partitions cp SET paused = coalesce(p_paused, false)
     WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.partition = ANY (p_partitions);
    PERFORM pg_notify(streamd.cg_channel(p_stream_name, p_group_id), 'pause');
END;
$$;

-- Moves one event to the dead letter queue, fenced like a commit: only the owner of
-- the partition at its epoch may. The event is copied from the log. A record already
-- there for the group (the same event failing again, e.g. after a replay) adds to its
-- attempts and becomes pending again, ready for another replay; that works when
-- retention has deleted the event since (the record holds its copy). Returns its id.
CREATE OR REPLACE FUNCTION streamd.dead_letter_event(
    p_stream_name      text,
    p_group_id         text,
    p_consumer_id      text,
    p_epoch            bigint,
    p_partition        integer,
    p_offset           bigint,
    p_error            text,
    p_error_detail     text,
    p_attempts         integer,
    p_first_failure_at timestamptz,
    p_now              timestamptz
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_id  bigint;
BEGIN
    PERFORM streamd.cg_fence(p_stream_name, p_group_id, p_consumer_id, p_epoch, ARRAY[p_partition], v_now);
    INSERT INTO streamd.dead_letter_queue AS d (stream_name, group_id, partition, "offset", event_id, event_type, key, data,
                                                data_bytes, metadata, event_timestamp, error, error_detail, attempts,
                                                first_failure_at, last_failure_at)
    SELECT e.stream_name, p_group_id, e.partition, e."offset", e.event_id, e.event_type, e.key, e.data,
           e.data_bytes, e.metadata, e."timestamp", coalesce(p_error, ''), p_error_detail, greatest(coalesce(p_attempts, 1), 1),
           coalesce(p_first_failure_at, v_now), v_now
      FROM streamd.events e
     WHERE e.stream_name = p_stream_name AND e.partition = p_partition AND e."offset" = p_offset
    ON CONFLICT (stream_name, group_id, partition, "offset") DO UPDATE
       SET attempts = d.attempts + EXCLUDED.attempts, error = EXCLUDED.error, error_detail = EXCLUDED.error_detail,
           last_failure_at = EXCLUDED.last_failure_at, status = 'pending', resolved_at = NULL, resolved_by = NULL,
           redelivered_at = NULL
    RETURNING d.id INTO v_id;
    IF v_id IS NULL THEN
        -- Not in the log any more: a redelivered dead letter failing again.
        UPDATE streamd.dead_letter_queue d
           SET attempts = d.attempts + greatest(coalesce(p_attempts, 1), 1), error = coalesce(p_error, ''),
               error_detail = p_error_detail, last_failure_at = v_now, status = 'pending', resolved_at = NULL,
               resolved_by = NULL, redelivered_at = NULL
         WHERE d.stream_name = p_stream_name AND d.group_id = p_group_id AND d.partition = p_partition
           AND d."offset" = p_offset
        RETURNING d.id INTO v_id;
    END IF;
    IF v_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('dead letter: no event at offset %s of %s/%s', p_offset, p_stream_name, p_partition);
    END IF;
    PERFORM streamd.advise('streamd.group.dead_lettered', p_stream_name || '/' || p_group_id,
        (SELECT jsonb_build_object('stream', d.stream_name, 'group', d.group_id, 'partition', d.partition,
                                   'offset', d."offset", 'event_id', d.event_id, 'event_type', d.event_type,
                                   'key', d.key, 'dead_letter_id', d.id, 'member', p_consumer_id, 'epoch', p_epoch,
                                   'error', d.error, 'attempts', d.attempts,
                                   'first_failure_at', d.first_failure_at, 'last_failure_at', d.last_failure_at)
           FROM streamd.dead_letter_queue d WHERE d.stream_name = p_stream_name AND d.id = v_id));
    RETURN v_id;
END;
$$;

-- Settles a pending dead letter of stream p_stream_name (SD106 when there is none with
-- that id, or it is not pending): replayed (redelivered to its group only: the
-- partition's owner in the group takes it with redeliveries_take; the group's members
-- are told on its channel), discarded, or resolved (dealt with by hand, without
-- replay), by p_by now. SD105 for another status.
CREATE OR REPLACE FUNCTION streamd.dead_letter_settle(p_stream_name text, p_id bigint, p_status text, p_by text,
                                                      p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_group text;
BEGIN
    IF p_status IS NULL OR p_status NOT IN ('replayed', 'discarded', 'resolved') THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('dead letter %s of %L: status %L: want replayed, discarded or resolved', p_id, p_stream_name, p_status);
    END IF;
    UPDATE streamd.dead_letter_queue d
       SET status = p_status, resolved_at = coalesce(p_now, clock_timestamp()), resolved_by = p_by, redelivered_at = NULL
     WHERE d.stream_name = p_stream_name AND d.id = p_id AND d.status = 'pending'
    RETURNING d.group_id INTO v_group;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SD106',
            MESSAGE = format('no pending dead letter %s of stream %L', p_id, p_stream_name);
    END IF;
    IF p_status = 'replayed' THEN
        PERFORM pg_notify(streamd.cg_channel(p_stream_name, v_group), 'redeliver');
    END IF;
END;
$$;

-- The replayed dead letters of a group's partition not yet redelivered, in offset
-- order, at most p_limit: what the partition's owner hands its handler before its next
-- fetch. Fenced like a commit (only the owner at its epoch).
CREATE OR REPLACE FUNCTION streamd.redeliveries_take(p_stream_name text, p_group_id text, p_consumer_id text,
                                                     p_epoch bigint, p_partition integer, p_limit integer)
RETURNS TABLE (id bigint, "offset" bigint, event_id text, event_type text, key text, data jsonb, data_bytes bytea,
               metadata jsonb, event_timestamp timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    PERFORM streamd.cg_fence(p_stream_name, p_group_id, p_consumer_id, p_epoch, ARRAY[p_partition], clock_timestamp());
    RETURN QUERY
    SELECT d.id, d."offset", d.event_id, d.event_type, d.key, d.data, d.data_bytes, d.metadata, d.event_timestamp
      FROM streamd.dead_letter_queue d
     WHERE d.stream_name = p_stream_name AND d.group_id = p_group_id AND d.partition = p_partition
       AND d.status = 'replayed' AND d.redelivered_at IS NULL
     ORDER BY d."offset"
     LIMIT greatest(coalesce(p_limit, 100), 1);
END;
$$;

-- Marks redeliveries p_ids handled, fenced like a commit; run it in the handler's
-- transaction to make the handler's writes and the mark one (Batch.CommitTx).
CREATE OR REPLACE FUNCTION streamd.redeliveries_done(p_stream_name text, p_group_id text, p_consumer_id text,
                                                     p_epoch bigint, p_partition integer, p_ids bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    PERFORM streamd.cg_fence(p_stream_name, p_group_id, p_consumer_id, p_epoch, ARRAY[p_partition], v_now);
    UPDATE streamd.dead_letter_queue d SET redelivered_at = v_now
     WHERE d.stream_name = p_stream_name AND d.group_id = p_group_id AND d.partition = p_partition
       AND d.id = ANY (p_ids) AND d.status = 'replayed' AND d.redelivered_at IS NULL;
END;
$$;
