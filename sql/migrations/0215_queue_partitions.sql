-- The queue's storage as a LIST partition per queue (issue 22, session 17, part23):
-- streamd.queue_messages becomes a table partitioned by stream_name, one partition per
-- queue (streamd.queue_messages_<md5 of the name>), made and dropped with the queue's
-- row as its sequence is (sql/functions/0300_messages.sql, queues_partition). Each
-- partition has its own PRIMARY KEY ("offset"): a queue's key holds its offsets alone
-- and grows at its right edge. The parent has no primary key; its indexes (dedup,
-- FIFO group, provenance, delayed lane) cascade to every partition; the dedup one, the
-- only unique one, includes stream_name. Storage parameters (fillfactor 50, the
-- autovacuum settings) are not inherited and are set on each partition.
--
-- A row for a queue without a partition goes to the default partition
-- queue_messages_no_queue, whose trigger refuses it (SD201, nothing written).
--
-- Seed 003's streamd.messages stays the same view (of the parent), with its INSTEAD OF
-- trigger (re-made by sql/functions/0250_seed_compat.sql after this migration).
--
-- Locks: in its one transaction the migration takes ACCESS EXCLUSIVE on the old
-- table, message_groups and queues from its start, copies every message (INSERT ...
-- SELECT, routed to the queues' partitions) and drops the old table: sends, receives,
-- settlements and queue changes wait until it commits, about as long as copying the
-- table (docs/operations.md).

LOCK TABLE streamd.queue_messages, streamd.message_groups, streamd.queues IN ACCESS EXCLUSIVE MODE;

ALTER TABLE streamd.queue_messages RENAME TO queue_messages_0086;
ALTER INDEX streamd.queue_messages_pkey RENAME TO queue_messages_0086_pkey;
DROP INDEX streamd.queue_messages_dedup, streamd.queue_messages_due, streamd.queue_messages_group,
    streamd.queue_messages_origin;

CREATE TABLE streamd.queue_messages (
    stream_name           text        NOT NULL,   -- the queue, the partition key
    "offset"              bigint      NOT NULL,   -- from the queue's sequence
    enqueued_at           timestamptz NOT NULL,
    visibility_timeout    timestamptz NOT NULL,   -- visible (again) at
    delivery_attempts     integer     NOT NULL DEFAULT 0,
    dedup                 boolean     NOT NULL DEFAULT false,
    lease_token           uuid,
    message_id            text        NOT NULL,
    data                  jsonb,
    data_bytes            bytea,
    tenant_id             text,
    group_key             text,                   -- FIFO queues
    metadata              jsonb,                  -- the headers
    max_delivery_attempts integer,                -- NULL: the queue's
    dead_letter_stream    text,                   -- NULL: the queue's
    last_error            text,
    origin_stream         text,                   -- dead letters' provenance
    origin_offset         bigint,
    origin_attempts       integer,
    dead_lettered_at      timestamptz,
    due_at                timestamptz,            -- the delayed lane (migration 0120)
    CONSTRAINT queue_messages_one_payload CHECK ((data IS NULL) <> (data_bytes IS NULL))
) PARTITION BY LIST (stream_name);

CREATE UNIQUE INDEX queue_messages_dedup ON streamd.queue_messages (message_id, stream_name) WHERE dedup;
CREATE INDEX queue_messages_group ON streamd.queue_messages (stream_name, group_key, (coalesce(tenant_id, '')), "offset")
    WHERE group_key IS NOT NULL;
CREATE INDEX queue_messages_origin ON streamd.queue_messages (origin_stream) WHERE origin_stream IS NOT NULL;
CREATE INDEX queue_messages_due ON streamd.queue_messages (stream_name, due_at) WHERE "offset" >= 4503599627370496;

-- Row-level security on the parent applies to statements through it; a statement that
-- names a partition is checked against the partition's own policy (each partition
-- gets the same one: queue_partition_make).
ALTER TABLE streamd.queue_messages ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON streamd.queue_messages
    USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))
    WITH CHECK ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()));

-- The default partition takes nothing: its trigger refuses every row.
CREATE OR REPLACE FUNCTION streamd.queue_messages_no_queue() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'SD201', MESSAGE = format('queue %L does not exist', NEW.stream_name);
END;
$$;
CREATE TABLE streamd.queue_messages_no_queue PARTITION OF streamd.queue_messages DEFAULT;
CREATE TRIGGER queue_messages_no_queue BEFORE INSERT OR UPDATE ON streamd.queue_messages_no_queue
    FOR EACH ROW EXECUTE FUNCTION streamd.queue_messages_no_queue();

-- A partition per queue (the function is re-made, the same, by
-- sql/functions/0300_messages.sql; it is here so this migration can use it), and one
-- for every queue name that has messages but no queue row (none should: queue_delete
-- deletes a queue's messages; such rows are kept, not lost).
CREATE OR REPLACE FUNCTION streamd.queue_partition_make(p_queue text) RETURNS regclass
LANGUAGE plpgsql AS $$
DECLARE
    v_name text := 'queue_messages_' || md5(p_queue);
    v_rel  regclass := to_regclass(format('streamd.%I', v_name));
    v_role name;
BEGIN
    IF v_rel IS NOT NULL THEN
        RETURN v_rel; -- made before (a deleted queue's partition is kept: queues_partition)
    END IF;
    -- Made apart and attached: CREATE TABLE ... PARTITION OF takes an ACCESS EXCLUSIVE
    -- lock of the parent, which waits for every transaction that touched any queue and
    -- stops every queue's traffic until this one commits; ATTACH PARTITION takes SHARE
    -- UPDATE EXCLUSIVE (queue traffic goes on) and ACCESS EXCLUSIVE of the default
    -- partition, which only statements for a missing queue touch.
    EXECUTE format('CREATE TABLE streamd.%I (LIKE streamd.queue_messages INCLUDING DEFAULTS INCLUDING CONSTRAINTS,'
                   ' PRIMARY KEY ("offset"), CHECK (stream_name = %L))'
                   ' WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.01,'
                   ' autovacuum_vacuum_threshold = 500, autovacuum_vacuum_insert_scale_factor = 0.05,'
                   ' autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0)', v_name, p_queue);
    EXECUTE format('ALTER TABLE streamd.queue_messages ATTACH PARTITION streamd.%I FOR VALUES IN (%L)', v_name, p_queue);
    EXECUTE format('ALTER TABLE streamd.%I ENABLE ROW LEVEL SECURITY', v_name);
    EXECUTE format('CREATE POLICY tenant_isolation ON streamd.%I'
                   ' USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))'
                   ' WITH CHECK ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))',
                   v_name);
    IF EXISTS (SELECT 1 FROM streamd.tenant_roles) THEN
        PERFORM pg_advisory_xact_lock(hashtext('streamd.tenant_roles'));
        FOR v_role IN SELECT t.role_name FROM streamd.tenant_roles t JOIN pg_catalog.pg_roles r ON r.rolname = t.role_name LOOP
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON streamd.%I TO %I', v_name, v_role);
        END LOOP;
    END IF;
    RETURN format('streamd.%I', v_name)::regclass;
END;
$$;

SELECT count(streamd.queue_partition_make(n))
FROM (SELECT q.queue_name AS n FROM streamd.queues q
      UNION SELECT DISTINCT m.stream_name FROM streamd.queue_messages_0086 m) s;

-- Every message moves as it is (in flight with its lease token and end, delayed in the
-- lane with its due_at, nacked, dead-lettered with its provenance, FIFO, of every
-- tenant), each to its queue's partition.
INSERT INTO streamd.queue_messages
SELECT m.stream_name, m."offset", m.enqueued_at, m.visibility_timeout, m.delivery_attempts, m.dedup, m.lease_token,
       m.message_id, m.data, m.data_bytes, m.tenant_id, m.group_key, m.metadata, m.max_delivery_attempts,
       m.dead_letter_stream, m.last_error, m.origin_stream, m.origin_offset, m.origin_attempts, m.dead_lettered_at,
       m.due_at
FROM streamd.queue_messages_0086 m
ORDER BY m.stream_name, m."offset";

-- Every other role keeps what it was granted on the storage (a send-only producer's
-- INSERT, docs/tenants.md "Any other role"): the grants go with the old table.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT a.grantee, a.privilege_type, a.is_grantable
             FROM pg_catalog.pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
             WHERE c.oid = 'streamd.queue_messages_0086'::regclass AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT %s ON streamd.queue_messages TO %s%s', r.privilege_type,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_catalog.pg_get_userbyid(r.grantee)) END,
                       CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END;
$$;

-- Seed 003's view, as migration 0086 made it, now of the new table: replaced, not
-- dropped, so it keeps its grants, column defaults and INSTEAD OF trigger.
CREATE OR REPLACE VIEW streamd.messages WITH (security_invoker = true) AS
SELECT m.stream_name, m."offset", m.message_id, m.data, m.metadata, m.enqueued_at, m.visibility_timeout,
       m.delivery_attempts,
       coalesce(m.max_delivery_attempts,
                (SELECT q.max_delivery_attempts FROM streamd.queues q WHERE q.queue_name = m.stream_name)) AS max_delivery_attempts,
       coalesce(m.dead_letter_stream,
                (SELECT q.dead_letter_queue FROM streamd.queues q WHERE q.queue_name = m.stream_name)) AS dead_letter_stream,
       m.lease_token, m.group_key, m.last_error, m.origin_stream, m.origin_offset, m.origin_attempts, m.dead_lettered_at,
       CASE WHEN m.lease_token IS NULL THEN m.visibility_timeout END AS not_before,
       m.dedup, m.tenant_id, m.data_bytes
FROM streamd.queue_messages m;
ALTER VIEW streamd.messages ALTER COLUMN dedup SET DEFAULT true;
ALTER VIEW streamd.messages ALTER COLUMN delivery_attempts SET DEFAULT 0;
ALTER VIEW streamd.messages ALTER COLUMN tenant_id SET DEFAULT nullif(current_setting('streamd.tenant_id', true), '');

DROP TABLE streamd.queue_messages_0086; -- and its policy; the publication loses it (re-added below)
ANALYZE streamd.queue_messages;

-- Tenant roles keep their privileges on the view and the parent (the partitions got
-- theirs above).
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT t.role_name FROM streamd.tenant_roles t JOIN pg_roles p ON p.rolname = t.role_name LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON streamd.messages, streamd.queue_messages TO %I', r.role_name);
    END LOOP;
END;
$$;

-- The publication lost the old table with its DROP: streamd.wakeup_publication_ensure
-- (sql/functions/0600_wakeup.sql, run after every migrate) adds the new one and
-- publishes its partitions' inserts as the parent's (publish_via_partition_root).
