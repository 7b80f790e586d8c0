-- Projections (package projection; table in migration 0061). Applied idempotently on
-- every migrate. Errors: SD005 (streams.ErrInvalidArgument) for bad input.

-- Stores p_state as the projection's state with the event (p_stream, p_partition,
-- p_offset, p_event_id) as its last applied one, and returns whether it did.
-- p_existed says what the caller's SELECT ... FOR UPDATE found: when the row existed
-- (and is locked by the caller) it is updated unless it already reflects the event
-- (same stream and partition, last_offset at or past p_offset); when it did not, the
-- row is inserted unless a concurrent transaction inserted it first (false: the
-- caller reads it again and recomputes, so no state is computed from a stale one).
CREATE OR REPLACE FUNCTION streamd.projection_store(
    p_type text, p_aggregate text, p_state jsonb, p_event_id text, p_event_ts timestamptz,
    p_stream text, p_partition integer, p_offset bigint, p_existed boolean, p_now timestamptz
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := coalesce(p_now, statement_timestamp());
    v_done boolean;
BEGIN
    IF p_type IS NULL OR p_type = '' OR p_aggregate IS NULL OR p_aggregate = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('projection: type %L and aggregate id %L must not be empty', p_type, p_aggregate);
    END IF;
    IF p_state IS NULL OR p_event_id IS NULL OR p_stream IS NULL OR p_partition IS NULL OR p_partition < 0
       OR p_offset IS NULL OR p_offset < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('projection %L/%L: a state and the applied event (stream, partition >= 0, offset >= 0, event id) are required',
                             p_type, p_aggregate);
    END IF;
    IF p_existed THEN
        UPDATE streamd.projections p
           SET state = p_state, last_event_id = p_event_id, last_event_timestamp = p_event_ts,
               stream_name = p_stream, partition = p_partition, last_offset = p_offset, updated_at = v_now
         WHERE p.projection_type = p_type AND p.aggregate_id = p_aggregate
           AND NOT (p.stream_name = p_stream AND p.partition = p_partition AND p.last_offset >= p_offset)
        RETURNING true INTO v_done;
    ELSE
        INSERT INTO streamd.projections (projection_type, aggregate_id, state, last_event_id, last_event_timestamp,
                                         stream_name, partition, last_offset, created_at, updated_at)
        VALUES (p_type, p_aggregate, p_state, p_event_id, p_event_ts, p_stream, p_partition, p_offset, v_now, v_now)
        ON CONFLICT (projection_type, aggregate_id) DO NOTHING
        RETURNING true INTO v_done;
    END IF;
    RETURN coalesce(v_done, false);
END;
$$;
