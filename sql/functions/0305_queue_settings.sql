-- Changes the given settings of queue p_queue, or creates it with the given ones and
-- the defaults for the rest; a NULL argument keeps the queue's setting (the default
-- for a new queue). p_set_dead_letter_queue says whether p_dead_letter_queue is given
-- (a NULL dead-letter queue removes it). Returns the queue's row as it now is.
--
-- Partial updates of one queue are serialised by a transaction advisory lock (class
-- 0x53445135 "SDQ5", key hashtext(queue)), so two of them that change different
-- settings both take effect: each reads the other's result before it writes.
-- streamd.queue_create, which sets every setting, still applies directly.
CREATE OR REPLACE FUNCTION streamd.queue_set(
    p_queue text, p_fifo boolean, p_visibility_timeout_ms bigint, p_max_delivery_attempts integer,
    p_set_dead_letter_queue boolean, p_dead_letter_queue text, p_max_payload_bytes integer
) RETURNS SETOF streamd.queues
LANGUAGE plpgsql AS $$
DECLARE
    v_q streamd.queues%ROWTYPE;
BEGIN
    IF NOT streamd.valid_stream_name(p_queue) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD202',
            MESSAGE = format('invalid queue name %L: use 1 to 249 characters of A-Z a-z 0-9 . _ -', p_queue);
    END IF;
    PERFORM pg_advisory_xact_lock(1396986165, hashtext(p_queue));
    SELECT * INTO v_q FROM streamd.queues q WHERE q.queue_name = p_queue;
    IF FOUND THEN
        PERFORM streamd.queue_create(p_queue,
            coalesce(p_fifo, v_q.fifo),
            coalesce(p_visibility_timeout_ms, v_q.visibility_timeout_ms),
            coalesce(p_max_delivery_attempts, v_q.max_delivery_attempts),
            CASE WHEN coalesce(p_set_dead_letter_queue, false) THEN p_dead_letter_queue ELSE v_q.dead_letter_queue END,
            coalesce(p_max_payload_bytes, v_q.max_payload_bytes));
    ELSE
        PERFORM streamd.queue_create(p_queue,
            coalesce(p_fifo, false),
            coalesce(p_visibility_timeout_ms, 30000),
            coalesce(p_max_delivery_attempts, 5),
            CASE WHEN coalesce(p_set_dead_letter_queue, false) THEN p_dead_letter_queue END,
            coalesce(p_max_payload_bytes, 262144));
    END IF;
    RETURN QUERY SELECT * FROM streamd.queues q WHERE q.queue_name = p_queue;
END;
$$;
