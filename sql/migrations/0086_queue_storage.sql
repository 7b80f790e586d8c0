-- The queue's storage (issue 22): seed 003's `messages` is the interface, not the
-- storage. streamd.messages becomes a view (its columns stay readable, and a plain
-- INSERT, UPDATE or DELETE on it still works: sql/functions/0250_seed_compat.sql) over
-- streamd.queue_messages, the table the queue's functions work on.
--
-- What the storage changes (bench/RESULTS.md, "Issue 22", has the measurements):
--   - No ready index. messages_ready (stream_name, not_before, "offset") was a second
--     index entry per send (about a tenth of a send's server time) and let a receive
--     skip delayed messages; a receive now reads the primary key in offset order and
--     skips what is not visible (in flight, delayed, nacked with a delay), as it
--     already skipped in-flight rows. not_before goes: visibility_timeout alone says
--     when a message is visible (the view derives not_before from it).
--   - Queue settings are not copied into every row. max_delivery_attempts and
--     dead_letter_stream are per-message overrides, NULL unless the sender gave one;
--     NULL means the queue's setting (the view shows the value in force). A change
--     of the queue's settings now applies to the messages it holds, as SQS's redrive
--     policy does.
--   - Offsets per queue (L5): each queue has its own sequence (queues.offset_seq),
--     made by queue_create and dropped by queue_delete. messages_offset_seq, the last
--     global counter of the schema, goes. Every queue's sequence starts after the
--     last offset the global one gave, so no offset a receipt names is ever reused.
--   - The rarely set columns (headers, group key, tenant, overrides, last error,
--     dead-letter provenance, binary payload) stay in the row, at its end, NULL when
--     unused: a NULL costs one bit of the row's null bitmap, a side table would cost a
--     join on every receive of a message that has one.
--
-- Locks: the migration rewrites every queue message (INSERT ... SELECT, then DROP
-- TABLE) in its one transaction, holding an ACCESS EXCLUSIVE lock on the old table
-- from the start: sends, receives and settlements wait until it commits. It takes
-- about as long as copying the table (docs/operations.md).

LOCK TABLE streamd.messages, streamd.message_groups IN ACCESS EXCLUSIVE MODE;

CREATE TABLE IF NOT EXISTS streamd.queue_messages (
    stream_name           text        NOT NULL,   -- the queue
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
    PRIMARY KEY (stream_name, "offset"),
    CONSTRAINT queue_messages_one_payload CHECK ((data IS NULL) <> (data_bytes IS NULL))
) WITH (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE streamd.queue_messages ALTER COLUMN stream_name SET (n_distinct = 1); -- see migration 0008

ALTER TABLE streamd.queues ADD COLUMN IF NOT EXISTS offset_seq regclass;

-- Each queue's sequence, after the global sequence's last offset.
DO $$
DECLARE
    v_last bigint;
    r      record;
    v_seq  text;
BEGIN
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END INTO v_last FROM streamd.messages_offset_seq s;
    FOR r IN SELECT q.queue_name FROM streamd.queues q WHERE q.offset_seq IS NULL ORDER BY q.queue_name LOOP
        v_seq := 'queue_offsets_' || md5(r.queue_name);
        EXECUTE format('CREATE SEQUENCE streamd.%I AS bigint MINVALUE 1 START %s', v_seq, greatest(v_last + 1, 1));
        UPDATE streamd.queues SET offset_seq = format('streamd.%I', v_seq)::regclass WHERE queue_name = r.queue_name;
    END LOOP;
END;
$$;

-- Every message moves, as it is: in flight (its lease token and lease end), delayed,
-- nacked, dead-lettered (with its provenance), of every tenant. A message is visible
-- when both of its old times have passed. Per-message settings equal to the queue's
-- become NULL (the queue's); others stay as overrides.
INSERT INTO streamd.queue_messages (stream_name, "offset", enqueued_at, visibility_timeout, delivery_attempts, dedup,
                                    lease_token, message_id, data, data_bytes, tenant_id, group_key, metadata,
                                    max_delivery_attempts, dead_letter_stream, last_error, origin_stream, origin_offset,
                                    origin_attempts, dead_lettered_at)
SELECT m.stream_name, m."offset", m.enqueued_at, greatest(m.visibility_timeout, m.not_before), m.delivery_attempts, m.dedup,
       m.lease_token, m.message_id, m.data, m.data_bytes, m.tenant_id, m.group_key, m.metadata,
       nullif(m.max_delivery_attempts, q.max_delivery_attempts),
       CASE WHEN m.dead_letter_stream IS NOT DISTINCT FROM q.dead_letter_queue THEN NULL ELSE m.dead_letter_stream END,
       m.last_error, m.origin_stream, m.origin_offset, m.origin_attempts, m.dead_lettered_at
FROM streamd.messages m
LEFT JOIN streamd.queues q ON q.queue_name = m.stream_name
ORDER BY m.stream_name, m."offset";

-- A message whose dead-letter override names no queue any more keeps its name: it is
-- treated as having none (queue_dlq_ok), as before.

DROP TABLE streamd.messages; -- with its trigger, policy, indexes and messages_offset_seq

CREATE UNIQUE INDEX IF NOT EXISTS queue_messages_dedup ON streamd.queue_messages (message_id, stream_name) WHERE dedup;
CREATE INDEX IF NOT EXISTS queue_messages_group ON streamd.queue_messages (stream_name, group_key, (coalesce(tenant_id, '')), "offset")
    WHERE group_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS queue_messages_origin ON streamd.queue_messages (origin_stream) WHERE origin_stream IS NOT NULL;
ANALYZE streamd.queue_messages;

ALTER TABLE streamd.queue_messages ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON streamd.queue_messages
    USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))
    WITH CHECK ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()));

-- Seed 003's table, as a view. security_invoker: the caller's privileges and
-- row-level security apply, as they did on the table. The view is automatically
-- updatable (UPDATE and DELETE reach queue_messages); INSERT goes through the INSTEAD
-- OF trigger of sql/functions/0250_seed_compat.sql. max_delivery_attempts and
-- dead_letter_stream are the values in force; not_before is when a message not in
-- flight becomes deliverable (NULL while it is leased).
CREATE VIEW streamd.messages WITH (security_invoker = true) AS
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

-- Tenant roles keep their privileges: on the view (the grant went with the table)
-- and on the storage and the queues' sequences (security_invoker).
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT t.role_name FROM streamd.tenant_roles t JOIN pg_roles p ON p.rolname = t.role_name LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON streamd.messages, streamd.queue_messages TO %I', r.role_name);
        EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA streamd TO %I', r.role_name);
    END LOOP;
END;
$$;

-- The wake-up publication (sql/functions/0600_wakeup.sql) lost the old table with its
-- DROP; streamd.wakeup_publication_ensure, run after every migrate, adds the storage.
