-- Registers (or renews) the p_slots brokers of listener p_listener at p_host:p_port for process
-- p_instance until p_ttl_ms from now, one row per slot 0 .. p_slots-1, and returns their node
-- ids in slot order. A row of a higher slot at that address (a restart with fewer slots) is
-- removed. An id is stable per listener, address and slot: an instance restarted at the same
-- address takes its rows over (the old process is gone or misconfigured: two live processes
-- cannot share an address). p_slots below 1 is refused (SD005, invalid argument).
CREATE OR REPLACE FUNCTION streamd.kafka_broker_heartbeat_slots(p_listener text, p_host text, p_port integer, p_instance text,
                                                                p_rack text, p_ttl_ms integer, p_slots integer,
                                                                p_now timestamptz DEFAULT NULL)
RETURNS SETOF integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    IF p_slots IS NULL OR p_slots < 1 THEN
        RAISE EXCEPTION 'kafka broker slots must be at least 1, not %', p_slots USING ERRCODE = 'SD005';
    END IF;
    DELETE FROM streamd.kafka_brokers
     WHERE listener = p_listener AND host = p_host AND port = p_port AND slot >= p_slots;
    -- Renew the slots that have a row, and insert only the missing ones: an INSERT ... ON
    -- CONFLICT evaluates the node id's default (nextval) for every row it proposes, so
    -- every heartbeat of every slot would use up a number of the integer sequence.
    UPDATE streamd.kafka_brokers AS b
       SET instance     = p_instance,
           rack         = p_rack,
           started_at   = CASE WHEN b.instance = p_instance THEN b.started_at ELSE v_now END,
           heartbeat_at = v_now,
           expires_at   = v_now + make_interval(secs => p_ttl_ms / 1000.0)
     WHERE b.listener = p_listener AND b.host = p_host AND b.port = p_port AND b.slot < p_slots;
    -- A concurrent heartbeat of the same address inserting the same slot is the only
    -- conflict left (two processes sharing an address: misconfigured).
    INSERT INTO streamd.kafka_brokers AS b (listener, host, port, slot, instance, rack, started_at, heartbeat_at, expires_at)
    SELECT p_listener, p_host, p_port, s, p_instance, p_rack, v_now, v_now, v_now + make_interval(secs => p_ttl_ms / 1000.0)
      FROM generate_series(0, p_slots - 1) AS s
     WHERE NOT EXISTS (SELECT 1 FROM streamd.kafka_brokers e
                        WHERE e.listener = p_listener AND e.host = p_host AND e.port = p_port AND e.slot = s)
    ON CONFLICT (listener, host, port, slot) DO UPDATE
       SET instance     = EXCLUDED.instance,
           rack         = EXCLUDED.rack,
           started_at   = CASE WHEN b.instance = EXCLUDED.instance THEN b.started_at ELSE EXCLUDED.started_at END,
           heartbeat_at = EXCLUDED.heartbeat_at,
           expires_at   = EXCLUDED.expires_at;
    RETURN QUERY
    SELECT b.node_id FROM streamd.kafka_brokers b
     WHERE b.listener = p_listener AND b.host = p_host AND b.port = p_port AND b.slot < p_slots
     ORDER BY b.slot;
END
$$;

-- The heartbeat of one slot (slot 0), as instances older than migration 0130 call it: it
-- returns that slot's node id.
CREATE OR REPLACE FUNCTION streamd.kafka_broker_heartbeat(p_listener text, p_host text, p_port integer, p_instance text,
                                                          p_rack text, p_ttl_ms integer, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE sql AS $$
    SELECT streamd.kafka_broker_heartbeat_slots(p_listener, p_host, p_port, p_instance, p_rack, p_ttl_ms, 1, p_now) LIMIT 1
$$;

-- Removes the broker rows of p_instance (every slot) at the address of node p_node_id at once
-- (a clean shutdown), so Metadata stops naming them before their heartbeat expires. Returns
-- whether it did.
CREATE OR REPLACE FUNCTION streamd.kafka_broker_deregister(p_node_id integer, p_instance text)
RETURNS boolean
LANGUAGE sql AS $$
    WITH d AS (DELETE FROM streamd.kafka_brokers b
                USING streamd.kafka_brokers me
                WHERE me.node_id = p_node_id AND me.instance = p_instance
                  AND b.listener = me.listener AND b.host = me.host AND b.port = me.port AND b.instance = p_instance
            RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM d)
$$;
