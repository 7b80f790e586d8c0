-- Queue dead letters' records (issue 20, point 2): the vocabulary group dead letters
-- have (pending, replayed, discarded, resolved; who and when; error and detail;
-- attempts; first and last failure), one record per (dead-letter queue, message id) in
-- streamd.queue_dead_letters, beside the dead-letter queue's message. Applied
-- idempotently on every migrate.
--
-- The queue's storage may change (issue 22). What these functions need from it:
-- whatever moves messages to a dead-letter queue calls queue_dead_lettered with the
-- moved messages; queue_redrive_offsets and queue_discard call
-- queue_dead_letters_mark with the ids they moved or deleted; queue_dead_letters_settle
-- finds a dead letter's offset by its message id and moves or deletes it through
-- queue_redrive_offsets and queue_discard.

-- Messages of queue p_queue moved to their dead-letter queues (queue_dead_letter, in
-- its transaction). p_moved: a JSON array of objects with dead_letter_queue,
-- dead_letter_offset, message_id, origin_offset, attempts, error, dead_lettered_at,
-- tenant_id (the message's: the record is its tenant's, whoever moved it).
-- Each gets its record (a message id the dead-letter queue had a record for counts as
-- the same dead letter failing again: attempts added, pending again, the resolution
-- cleared) and its advisory (streamd.queue.dead_lettered). A role that may not write
-- the records (an unbound role granted the queue tables only) still moves its
-- messages: the records are skipped, never the move.
CREATE OR REPLACE FUNCTION streamd.queue_dead_lettered(p_queue text, p_moved jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    m jsonb;
BEGIN
    IF has_table_privilege('streamd.queue_dead_letters', 'INSERT') AND has_table_privilege('streamd.queue_dead_letters', 'UPDATE') THEN
    INSERT INTO streamd.queue_dead_letters AS d (dead_letter_queue, message_id, origin_queue, origin_offset, error,
                                                 attempts, first_failure_at, last_failure_at, tenant_id)
    SELECT x ->> 'dead_letter_queue', x ->> 'message_id', p_queue, (x ->> 'origin_offset')::bigint, x ->> 'error',
           coalesce((x ->> 'attempts')::integer, 0), (x ->> 'dead_lettered_at')::timestamptz,
           (x ->> 'dead_lettered_at')::timestamptz, x ->> 'tenant_id'
      FROM jsonb_array_elements(coalesce(p_moved, '[]')) x
    ON CONFLICT (dead_letter_queue, message_id) DO UPDATE
       SET origin_queue = EXCLUDED.origin_queue, origin_offset = EXCLUDED.origin_offset, error = EXCLUDED.error,
           error_detail = NULL, attempts = d.attempts + EXCLUDED.attempts, last_failure_at = EXCLUDED.last_failure_at,
           status = 'pending', resolved_at = NULL, resolved_by = NULL;
    END IF;
    FOR m IN SELECT x FROM jsonb_array_elements(coalesce(p_moved, '[]')) x LOOP
        PERFORM streamd.advise('streamd.queue.dead_lettered', p_queue, jsonb_build_object('queue', p_queue) || (m - 'tenant_id'));
    END LOOP;
END;
$$;

-- Marks the pending records of messages p_ids of dead-letter queue p_dlq p_status
-- (replayed, discarded or resolved) by p_by at p_now. Returns the ids marked. A role
-- that may not update the records marks nothing (its redrive or discard goes on).
CREATE OR REPLACE FUNCTION streamd.queue_dead_letters_mark(p_dlq text, p_ids text[], p_status text, p_by text,
                                                           p_now timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(p_ids) = 0 OR NOT has_table_privilege('streamd.queue_dead_letters', 'UPDATE') THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE streamd.queue_dead_letters d
       SET status = p_status, resolved_at = coalesce(p_now, clock_timestamp()), resolved_by = p_by
     WHERE d.dead_letter_queue = p_dlq AND d.message_id = ANY (p_ids) AND d.status = 'pending'
    RETURNING d.message_id;
END;
$$;

-- Settles pending dead letters of dead-letter queue p_dlq by message id: replayed
-- (moved back to the queue it came from, as a redrive moves it), discarded or resolved
-- (deleted from the dead-letter queue: resolved says it was dealt with by hand),
-- recording p_by and the time. A dead letter in flight (someone is receiving from the
-- dead-letter queue), whose origin queue is gone (replay), or that is not pending is
-- left as it is; a pending record whose message already left the dead-letter queue
-- (a consumer of it acked it) can be discarded or resolved, not replayed. Returns the
-- ids settled. SD204 for another status.
CREATE OR REPLACE FUNCTION streamd.queue_dead_letters_settle(p_dlq text, p_ids text[], p_status text, p_by text,
                                                             p_now timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_pending text[];
    v_offs    bigint[];
    v_moved   text[];
BEGIN
    PERFORM streamd.queue_get(p_dlq);
    IF p_status IS NULL OR p_status NOT IN ('replayed', 'discarded', 'resolved') THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('dead letters of %L: status %L: want replayed, discarded or resolved', p_dlq, p_status);
    END IF;
    SELECT coalesce(array_agg(d.message_id ORDER BY d.message_id), '{}') INTO v_pending FROM (
        SELECT d.message_id FROM streamd.queue_dead_letters d
         WHERE d.dead_letter_queue = p_dlq AND d.message_id = ANY (p_ids) AND d.status = 'pending'
         ORDER BY d.message_id FOR UPDATE) d;
    SELECT coalesce(array_agg(m."offset" ORDER BY m."offset"), '{}') INTO v_offs FROM streamd.queue_messages m
     WHERE m.stream_name = p_dlq AND m.message_id = ANY (v_pending);
    IF p_status = 'replayed' THEN
        PERFORM streamd.queue_redrive_offsets(p_dlq, v_offs, v_now);
        -- Those moved were marked replayed (by nobody) by the move.
        SELECT coalesce(array_agg(d.message_id), '{}') INTO v_moved FROM streamd.queue_dead_letters d
         WHERE d.dead_letter_queue = p_dlq AND d.message_id = ANY (v_pending) AND d.status = 'replayed';
    ELSE
        PERFORM streamd.queue_discard(p_dlq, v_offs, v_now);
        -- Deleted now (marked discarded by the delete), or gone before: settled.
        SELECT coalesce(array_agg(x.id), '{}') INTO v_moved FROM unnest(v_pending) x(id)
         WHERE NOT EXISTS (SELECT 1 FROM streamd.queue_messages m WHERE m.stream_name = p_dlq AND m.message_id = x.id);
    END IF;
    RETURN QUERY
    UPDATE streamd.queue_dead_letters d SET status = p_status, resolved_at = v_now, resolved_by = p_by
     WHERE d.dead_letter_queue = p_dlq AND d.message_id = ANY (v_moved)
    RETURNING d.message_id;
END;
$$;

-- The dead letters of dead-letter queue p_dlq with status p_status (NULL: all), oldest
-- failure first. A pending record whose message is no longer in the dead-letter queue
-- (a consumer of that queue acked it, or it was purged) reads as resolved, by nobody,
-- at its last failure. in_queue: the message is in the dead-letter queue (offset set).
CREATE OR REPLACE FUNCTION streamd.queue_dead_letters_list(p_dlq text, p_status text)
RETURNS TABLE (dead_letter_queue text, message_id text, "offset" bigint, origin_queue text, origin_offset bigint,
               status text, error text, error_detail text, attempts integer, first_failure_at timestamptz,
               last_failure_at timestamptz, resolved_at timestamptz, resolved_by text)
LANGUAGE sql STABLE AS $$
    SELECT x.* FROM (
        SELECT d.dead_letter_queue, d.message_id, m."offset", d.origin_queue, d.origin_offset,
               CASE WHEN d.status = 'pending' AND m."offset" IS NULL THEN 'resolved' ELSE d.status END AS status,
               d.error, d.error_detail, d.attempts, d.first_failure_at, d.last_failure_at,
               CASE WHEN d.status = 'pending' AND m."offset" IS NULL THEN d.last_failure_at ELSE d.resolved_at END
                   AS resolved_at,
               d.resolved_by
          FROM streamd.queue_dead_letters d
          LEFT JOIN streamd.queue_messages m ON m.stream_name = d.dead_letter_queue AND m.message_id = d.message_id
         WHERE d.dead_letter_queue = p_dlq) x
     WHERE p_status IS NULL OR x.status = p_status
     ORDER BY x.first_failure_at, x.message_id
$$;
