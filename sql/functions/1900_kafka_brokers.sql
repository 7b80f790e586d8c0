-- Registers (or renews) the broker of listener p_listener at p_host:p_port for process p_instance until
-- p_ttl_ms from now, and returns its node id. The id is stable per listener and address: an
-- instance restarted at the same address takes its row over (the old process is gone
-- or misconfigured: two live processes cannot share an address).
CREATE OR REPLACE FUNCTION streamd.kafka_broker_heartbeat(p_listener text, p_host text, p_port integer, p_instance text,
                                                          p_rack text, p_ttl_ms integer, p_now timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE sql AS $$
    INSERT INTO streamd.kafka_brokers AS b (listener, host, port, instance, rack, started_at, heartbeat_at, expires_at)
    VALUES (p_listener, p_host, p_port, p_instance, p_rack, coalesce(p_now, clock_timestamp()), coalesce(p_now, clock_timestamp()),
            coalesce(p_now, clock_timestamp()) + make_interval(secs => p_ttl_ms / 1000.0))
    ON CONFLICT (listener, host, port) DO UPDATE
       SET instance     = EXCLUDED.instance,
           rack         = EXCLUDED.rack,
           started_at   = CASE WHEN b.instance = EXCLUDED.instance THEN b.started_at ELSE EXCLUDED.started_at END,
           heartbeat_at = EXCLUDED.heartbeat_at,
           expires_at   = EXCLUDED.expires_at
    RETURNING b.node_id
$$;

-- Removes the broker row of p_instance at once (a clean shutdown), so Metadata stops
-- naming it before its heartbeat expires. Returns whether it did.
CREATE OR REPLACE FUNCTION streamd.kafka_broker_deregister(p_node_id integer, p_instance text)
RETURNS boolean
LANGUAGE sql AS $$
    WITH d AS (DELETE FROM streamd.kafka_brokers WHERE node_id = p_node_id AND instance = p_instance RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM d)
$$;
