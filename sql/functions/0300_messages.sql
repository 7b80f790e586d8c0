-- Functions of the visibility-timeout queue (messages/ package). Applied idempotently on
-- every migrate.
--
-- Errors use SQLSTATE class SD, mapped to sentinels in messages/errors.go:
--   SD201 queue not found      SD202 invalid queue name    SD203 payload too large
--   SD204 invalid argument     SD205 queue in use
--
-- Time (DESIGN.md, the clock rule): every function takes p_now so tests control the
-- clock. NULL means clock_timestamp(), read after the locks the function waits for,
-- not now(): now() is the start of the caller's transaction, so in a long transaction
-- (SendTx in an outbox transaction, a receive or nack in the caller's own) a send's
-- Delay, a lease or a nack's delay counted from a moment long past, and a delayed
-- message was visible at commit. Nor the start of the call when the call then waits:
-- a FIFO extension, nack or send waits for its group's row (an open SendTx to the
-- group holds it), and its lease or delay counts from when it got the row. Receive
-- waits for nothing (SKIP LOCKED). queue_stats only reads: statement_timestamp().
--
-- Every function that reads messages by queue sets enable_seqscan = off: migration
-- 0008 tells the planner that a queue is the whole table (n_distinct = 1, for the hot
-- functions' generic plans), which would otherwise make it scan the whole table
-- rather than the queue's range of the primary key.
--
-- Plans: queue_messages is partitioned by queue (migration 0215), and a generic plan
-- through the parent locks every queue's partition and index before it prunes
-- (PostgreSQL 15): every function that reads or writes queue_messages runs
-- plan_cache_mode = force_custom_plan, planned at each call with the queue's name
-- known, so it locks the parent and the queue's partition only. That planning costs
-- the drain about 700 µs per receive + ack of 100 (bench/RESULTS.md, "Issue 22,
-- session 17 (part23)"). Statements of message_groups alone switch to generic plans
-- around them (set_config, restored at the function's exit). Before migration 0215:
-- send, receive and ack ran on every message, so they used generic plans (no
-- planning per call) and said which plan they wanted. Left to estimates, the planner
-- took a whole-queue scan and sort for a receive whenever the statistics were small
-- (a queue drained when autovacuum analyzed the table, or a new queue), and kept that
-- plan for the connection's life: 14 ms instead of 0.3 ms for a receive of 100 from
-- 20,000. The enable_* settings only price the alternatives out; the index paths
-- they leave always exist. queue_receive, queue_ack, queue_lock_groups and
-- queue_groups_advance also turn hash and merge joins off: joining a batch's groups
-- (or receipts) to message_groups, the planner hashed every group of the queue (and,
-- locking the groups of an ack, looked up every group's head) instead of looking up
-- the batch's own: O(groups in the queue) per receive and settlement.
-- Storage (migration 0086): the functions read and write streamd.queue_messages;
-- streamd.messages is seed 003's view of it. A message's max_delivery_attempts and
-- dead_letter_stream are overrides, NULL for the queue's setting (read from the
-- queue's row, which every function reads once anyway). Offsets come from the queue's
-- own sequence (queues.offset_seq). Nothing but the functions below and the view's
-- INSTEAD OF trigger inserts into queue_messages, so no trigger runs on the hot path.
-- Ownership: a settlement names each message by ("offset", lease_token); the token is
-- checked in the statement's WHERE clause, so a receipt whose message was received
-- again since (a new token) changes nothing. A receipt named twice settles once. A
-- negative offset is refused (SD204) before anything is settled.
--
-- Lock order, to rule out deadlocks: FIFO group rows (message_groups) in (group_key,
-- tenant_id) order, then message rows. Receive locks groups and messages with SKIP
-- LOCKED and so never waits.
--
-- Tenants: a FIFO group is (queue, group key, tenant) (migration 0014): each tenant's
-- messages of a group key form their own group, and the group row's tenant_id is the
-- messages' tenant_id, or '' for messages without one. Row-level security shows a
-- tenant role only its own groups and messages; the owner sees all of them, so every
-- statement that goes from a group row to its messages names the tenant.

-- (The older signatures of queue_ack, queue_nack, queue_extend, queue_term, queue_send,
-- queue_lock_groups and queue_groups_advance are dropped by migration 0023, those
-- that binary payloads changed by migration 0066.)

-- The queue's row; raises SD202 for an invalid name and SD201 for an unknown queue.
CREATE OR REPLACE FUNCTION streamd.queue_get(p_queue text) RETURNS streamd.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v streamd.queues%ROWTYPE;
BEGIN
    SELECT * INTO v FROM streamd.queues q WHERE q.queue_name = p_queue;
    IF NOT FOUND THEN
        IF NOT streamd.valid_stream_name(p_queue) THEN
            RAISE EXCEPTION USING ERRCODE = 'SD202',
                MESSAGE = format('invalid queue name %L: use 1 to 249 characters of A-Z a-z 0-9 . _ -', p_queue);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'SD201', MESSAGE = format('queue %L does not exist', p_queue);
    END IF;
    RETURN v;
END;
$$;

-- Whether a message's dead-letter queue (its dead_letter_stream) can take it now: a
-- standard queue of that name exists. A message keeps the name it was sent with, and
-- that queue may since have been deleted (or made again as a FIFO queue): such a
-- message is treated as having no dead-letter queue (retried until acked, or deleted
-- by a term) rather than moved to a queue that is not there.
CREATE OR REPLACE FUNCTION streamd.queue_dlq_ok(p_dlq text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_dlq IS NOT NULL AND EXISTS (SELECT 1 FROM streamd.queues q WHERE q.queue_name = p_dlq AND NOT q.fifo)
$$;

-- Serialises a queue's deletion with everything that puts messages into it: a
-- function that inserts into a queue takes this lock shared (and then reads the
-- queue), queue_delete takes it exclusive. Without it, a send (or a dead-letter move,
-- or a redrive) that committed while the queue was being deleted left rows of a queue
-- that no longer existed, and a redrive into a queue deleted meanwhile lost them.
-- Advisory lock class 0x53445134 ("SDQ4"), key hashtext(queue name).
CREATE OR REPLACE FUNCTION streamd.queue_lock_shared(p_queues text[]) RETURNS void
LANGUAGE sql AS $$
    SELECT count(pg_advisory_xact_lock_shared(1396986164, hashtext(q)))
    FROM (SELECT DISTINCT q FROM unnest(p_queues) q WHERE q IS NOT NULL ORDER BY q) l
$$;

-- Every queue has its offsets' sequence (L5: offsets per queue; migration 0086), in
-- steps of 128 (a block of offsets per nextval: queue_take_offsets, migration 0205),
-- however its row is made (queue_create, or a plain INSERT INTO streamd.queues), and
-- the sequence goes with the row. Its name is fixed by the queue's name, so a
-- queue_create of an existing queue (an upsert, which fires this trigger before it
-- finds the row) finds it made. The queue's lock of class 0x53445135 ("SDQ5", as
-- queue_set) makes concurrent creators of one queue make it once. Tenant roles may
-- take offsets from it (their sends and plain INSERTs), as from every sequence of the
-- schema (bind_tenant_role); the grants take bind_tenant_role's lock, since
-- concurrent GRANTs can fail with "tuple concurrently updated".
CREATE OR REPLACE FUNCTION streamd.queues_offset_seq() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_name text := 'queue_offsets_' || md5(NEW.queue_name);
    v_role name;
BEGIN
    NEW.offset_seq := to_regclass(format('streamd.%I', v_name));
    IF NEW.offset_seq IS NOT NULL THEN
        RETURN NEW;
    END IF;
    PERFORM pg_advisory_xact_lock(1396986165, hashtext(NEW.queue_name));
    EXECUTE format('CREATE SEQUENCE IF NOT EXISTS streamd.%I AS bigint MINVALUE 1 START 1 INCREMENT BY 128', v_name);
    IF EXISTS (SELECT 1 FROM streamd.tenant_roles) THEN
        PERFORM pg_advisory_xact_lock(hashtext('streamd.tenant_roles'));
        FOR v_role IN SELECT t.role_name FROM streamd.tenant_roles t JOIN pg_catalog.pg_roles r ON r.rolname = t.role_name LOOP
            EXECUTE format('GRANT USAGE ON SEQUENCE streamd.%I TO %I', v_name, v_role);
        END LOOP;
    END IF;
    NEW.offset_seq := format('streamd.%I', v_name)::regclass;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE FUNCTION streamd.queues_drop_offset_seq() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.offset_seq IS NOT NULL THEN
        EXECUTE format('DROP SEQUENCE IF EXISTS %s', OLD.offset_seq);
    END IF;
    RETURN NULL;
END;
$$;

-- Every queue has its partition of streamd.queue_messages (migration 0215), made when
-- its row is inserted (an upsert that finds the row fires no AFTER INSERT trigger) and
-- dropped with the row, as its sequence is. The partition gets the parent's policy and
-- storage parameters (neither is inherited) and the tenant roles' grants, as the
-- sequence does (a statement that names a partition is checked against the
-- partition's privileges and policies, not the parent's).
CREATE OR REPLACE FUNCTION streamd.queue_partition_make(p_queue text) RETURNS regclass
LANGUAGE plpgsql AS $$
DECLARE
    v_name text := 'queue_messages_' || md5(p_queue);
    v_rel  regclass := to_regclass(format('streamd.%I', v_name));
    v_role name;
    v_timeout text;
BEGIN
    IF v_rel IS NOT NULL THEN
        -- Made before: a deleted queue's partition is kept (queues_partition), refusing
        -- rows until now. (DISABLE, not DROP: SHARE ROW EXCLUSIVE does not wait for
        -- readers of every partition.)
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                   WHERE t.tgrelid = v_rel AND t.tgname = 'queue_messages_no_queue' AND t.tgenabled <> 'D') THEN
            EXECUTE format('ALTER TABLE %s DISABLE TRIGGER queue_messages_no_queue', v_rel);
        END IF;
        RETURN v_rel;
    END IF;
    -- ATTACH's locks, in its order, taken 50 ms at a time: it needs the default
    -- partition's ACCESS EXCLUSIVE lock, which waits for every open transaction that
    -- read all partitions (queue_stats, a plain SELECT of messages of every queue),
    -- and every such statement of any queue would wait behind it as long. Between
    -- tries the others go on.
    v_timeout := current_setting('lock_timeout');
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '50ms', true);
            LOCK TABLE ONLY streamd.queue_messages IN SHARE UPDATE EXCLUSIVE MODE;
            LOCK TABLE streamd.queue_messages_no_queue IN ACCESS EXCLUSIVE MODE;
            PERFORM set_config('lock_timeout', v_timeout, true);
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.05 + 0.05 * random());
        END;
    END LOOP;
    -- Made apart and attached: CREATE TABLE ... PARTITION OF takes an ACCESS EXCLUSIVE
    -- lock of the parent, which waits for every transaction that touched any queue and
    -- stops every queue's traffic until this one commits; ATTACH PARTITION takes SHARE
    -- UPDATE EXCLUSIVE (queue traffic goes on) and ACCESS EXCLUSIVE of the default
    -- partition (taken above), which statements for a missing queue and statements
    -- that read every partition touch.
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

CREATE OR REPLACE FUNCTION streamd.queues_partition() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_timeout text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM streamd.queue_partition_make(NEW.queue_name);
    ELSE
        -- Dropping a partition takes an ACCESS EXCLUSIVE lock of the parent: it waits
        -- for every open transaction that touched any queue, and every queue's traffic
        -- queues behind it. Tried for 50 ms at most; otherwise the empty partition is
        -- kept (a queue made again under the name reuses it).
        v_timeout := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', '50ms', true);
            EXECUTE format('DROP TABLE IF EXISTS streamd.%I', 'queue_messages_' || md5(OLD.queue_name));
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            -- Kept: it refuses rows (SD201) as the default partition does, until a
            -- queue is made again under the name (queue_partition_make). Else a plain
            -- INSERT of the deleted queue was stored, and the queue made again
            -- delivered it and failed its first send on the offset it held.
            BEGIN
                PERFORM set_config('lock_timeout', '50ms', true);
                EXECUTE format('CREATE OR REPLACE TRIGGER queue_messages_no_queue BEFORE INSERT OR UPDATE ON streamd.%I'
                               ' FOR EACH ROW EXECUTE FUNCTION streamd.queue_messages_no_queue()',
                               'queue_messages_' || md5(OLD.queue_name));
                EXECUTE format('ALTER TABLE streamd.%I ENABLE TRIGGER queue_messages_no_queue',
                               'queue_messages_' || md5(OLD.queue_name));
            EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
                NULL; -- a transaction of this queue holds it: rows are taken, as before 0215
            END;
        END;
        PERFORM set_config('lock_timeout', v_timeout, true);
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER queues_partition
    AFTER INSERT OR DELETE ON streamd.queues
    FOR EACH ROW
    EXECUTE FUNCTION streamd.queues_partition();

CREATE OR REPLACE TRIGGER queues_offset_seq
    BEFORE INSERT ON streamd.queues
    FOR EACH ROW
    WHEN (NEW.offset_seq IS NULL)
    EXECUTE FUNCTION streamd.queues_offset_seq();

CREATE OR REPLACE TRIGGER queues_drop_offset_seq
    AFTER DELETE ON streamd.queues
    FOR EACH ROW
    EXECUTE FUNCTION streamd.queues_drop_offset_seq();

-- Creates a queue, or updates an existing one's settings. A queue cannot switch between
-- standard and FIFO; its dead-letter queue must exist, differ from it and be standard.
CREATE OR REPLACE FUNCTION streamd.queue_create(
    p_queue text, p_fifo boolean, p_visibility_timeout_ms bigint, p_max_delivery_attempts integer,
    p_dead_letter_queue text, p_max_payload_bytes integer
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_fifo boolean;
    v_dlq  streamd.queues%ROWTYPE;
BEGIN
    IF NOT streamd.valid_stream_name(p_queue) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD202',
            MESSAGE = format('invalid queue name %L: use 1 to 249 characters of A-Z a-z 0-9 . _ -', p_queue);
    END IF;
    IF p_visibility_timeout_ms IS NULL OR p_visibility_timeout_ms <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: visibility timeout %s ms must be positive', p_queue, p_visibility_timeout_ms);
    END IF;
    IF p_max_delivery_attempts IS NULL OR p_max_delivery_attempts < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: max delivery attempts %s must be at least 1', p_queue, p_max_delivery_attempts);
    END IF;
    IF p_max_payload_bytes IS NULL OR p_max_payload_bytes < 1 OR p_max_payload_bytes > 67108864 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: max payload %s bytes must be between 1 and 67108864', p_queue, p_max_payload_bytes);
    END IF;
    IF p_dead_letter_queue IS NOT NULL THEN
        IF p_dead_letter_queue = p_queue THEN
            RAISE EXCEPTION USING ERRCODE = 'SD204',
                MESSAGE = format('queue %L cannot be its own dead-letter queue', p_queue);
        END IF;
        v_dlq := streamd.queue_get(p_dead_letter_queue);
        IF v_dlq.fifo THEN
            RAISE EXCEPTION USING ERRCODE = 'SD204',
                MESSAGE = format('dead-letter queue %L of %L is FIFO; a dead-letter queue must be standard', p_dead_letter_queue, p_queue);
        END IF;
    END IF;
    IF coalesce(p_fifo, false) AND EXISTS (SELECT 1 FROM streamd.queues q WHERE q.dead_letter_queue = p_queue) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L is a dead-letter queue and cannot be FIFO', p_queue);
    END IF;

    SELECT q.fifo INTO v_fifo FROM streamd.queues q WHERE q.queue_name = p_queue FOR UPDATE;
    IF FOUND AND v_fifo <> coalesce(p_fifo, false) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L exists as a %s queue; its type cannot change', p_queue,
                             CASE WHEN v_fifo THEN 'FIFO' ELSE 'standard' END);
    END IF;
    INSERT INTO streamd.queues AS q (queue_name, fifo, visibility_timeout_ms, max_delivery_attempts,
                                     dead_letter_queue, max_payload_bytes)
    VALUES (p_queue, coalesce(p_fifo, false), p_visibility_timeout_ms, p_max_delivery_attempts,
            p_dead_letter_queue, p_max_payload_bytes)
    ON CONFLICT (queue_name) DO UPDATE SET
        visibility_timeout_ms = EXCLUDED.visibility_timeout_ms,
        max_delivery_attempts = EXCLUDED.max_delivery_attempts,
        dead_letter_queue     = EXCLUDED.dead_letter_queue,
        max_payload_bytes     = EXCLUDED.max_payload_bytes,
        updated_at            = now();
END;
$$;

-- Deletes a queue and its messages. Refused (SD205) while another queue uses it as its
-- dead-letter queue. Returns false when it did not exist.
CREATE OR REPLACE FUNCTION streamd.queue_delete(p_queue text) RETURNS boolean
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
DECLARE
    v_user text;
BEGIN
    PERFORM pg_advisory_xact_lock(1396986164, hashtext(p_queue));
    PERFORM 1 FROM streamd.queues q WHERE q.queue_name = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT q.queue_name INTO v_user FROM streamd.queues q WHERE q.dead_letter_queue = p_queue LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SD205',
            MESSAGE = format('queue %L is the dead-letter queue of %L; change that queue first', p_queue, v_user);
    END IF;
    DELETE FROM streamd.message_groups g WHERE g.stream_name = p_queue;
    DELETE FROM streamd.queue_messages m WHERE m.stream_name = p_queue;
    DELETE FROM streamd.queues q WHERE q.queue_name = p_queue; -- and its sequence (queues_drop_offset_seq)
    RETURN true;
END;
$$;

-- Checks a batch for queue_send and raises the first message's error: payload errors
-- (no data, over the queue's size) before the others. Returns NULL when every message
-- passes.
CREATE OR REPLACE FUNCTION streamd.queue_send_check(
    v_q streamd.queues, p_ids text[], p_data text[], p_metadata text[], p_delays_ms bigint[],
    p_max_attempts integer[], p_groups text[], p_data_bytes bytea[] DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    p_queue text := v_q.queue_name;
    v_bad   integer;
    v_bad2  integer;
BEGIN
    -- One pass over the batch for both checks (a statement costs as much as the
    -- check); payload errors are reported first. The arrays are read by unnest, not
    -- by subscript: a subscript of an array of text walks it from the start.
    SELECT min(u.i) FILTER (WHERE (u.d IS NULL) = (u.b IS NULL)
                               OR coalesce(octet_length(u.d), octet_length(u.b)) + coalesce(octet_length(u.md), 0) > v_q.max_payload_bytes),
           min(u.i) FILTER (WHERE (u.id IS NOT NULL AND (u.id = '' OR length(u.id) > 512))
                               OR u.dl < 0
                               OR u.ma < 1
                               OR (v_q.fifo AND (u.g IS NULL OR u.g = '' OR length(u.g) > 512))
                               OR (NOT v_q.fifo AND u.g IS NOT NULL))
    INTO v_bad, v_bad2
    FROM unnest(p_data, p_metadata, p_ids, p_delays_ms, p_max_attempts, p_groups, p_data_bytes) WITH ORDINALITY u(d, md, id, dl, ma, g, b, i);
    IF v_bad IS NOT NULL THEN
        IF p_data[v_bad] IS NULL AND p_data_bytes[v_bad] IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'SD204', MESSAGE = format('queue %L: message %s has no data', p_queue, v_bad);
        END IF;
        IF p_data[v_bad] IS NOT NULL AND p_data_bytes[v_bad] IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'SD204',
                MESSAGE = format('queue %L: message %s has both data and data_bytes; give one', p_queue, v_bad);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'SD203',
            MESSAGE = format('queue %L: message %s is %s bytes with its headers; the queue allows %s', p_queue, v_bad,
                             coalesce(octet_length(p_data[v_bad]), octet_length(p_data_bytes[v_bad])) + coalesce(octet_length(p_metadata[v_bad]), 0),
                             v_q.max_payload_bytes);
    END IF;
    v_bad := v_bad2;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: message %s: %s', p_queue, v_bad, CASE
                WHEN p_ids[v_bad] = '' OR length(p_ids[v_bad]) > 512 THEN 'message id must be 1 to 512 characters'
                WHEN p_delays_ms[v_bad] < 0 THEN format('delay %s ms is negative', p_delays_ms[v_bad])
                WHEN p_max_attempts[v_bad] < 1 THEN format('max delivery attempts %s must be at least 1', p_max_attempts[v_bad])
                WHEN v_q.fifo THEN 'a FIFO queue needs a group key of 1 to 512 characters'
                ELSE 'a group key needs a FIFO queue' END);
    END IF;
    RETURN NULL;
END;
$$;

-- Sends a batch of messages to one queue and returns, for each (ord = 1-based index),
-- its offset and whether it was a duplicate: a message whose message_id the queue
-- holds is not stored again, and its row carries the original's offset. The arrays
-- are parallel; any but p_data may be NULL. A NULL message id gets a UUID; a NULL
-- deliver-at means now + the delay (0 when NULL). Offsets are the queue's sequence's,
-- taken in batch order before the insert (queue_take_offsets: consecutive in a batch
-- of up to 128), so the result is read from the arrays, not
-- from the insert's rows (no join or sort of them).
--
-- Dedup covers the ids a sender names (migration 0012): such a row has dedup = true
-- and is in the partial unique index queue_messages_dedup. A generated id (a NULL in
-- p_ids) is a random UUID that cannot repeat; its row stays out of that index. The
-- index is the queue's, across tenants: a tenant role that names an id held by a
-- message it cannot see gets SD204 and nothing of the batch is stored
-- (docs/tenants.md).
--
-- p_fresh_ids says the caller made every id of the batch itself, as random UUIDs
-- (messages/ does for a batch that names no id): none is a dedup key, so the insert
-- skips ON CONFLICT's speculative insertion (9% of the send + receive + ack CPU) and
-- the dedup index altogether.
--
-- A message's max delivery attempts and dead-letter queue are stored only when the
-- sender overrides the queue's (p_max_attempts, p_dlqs); NULL means the queue's.
CREATE OR REPLACE FUNCTION streamd.queue_send(
    p_queue        text,
    p_ids          text[],
    p_data         text[],
    p_metadata     text[],
    p_delays_ms    bigint[],
    p_deliver_at   timestamptz[],
    p_groups       text[],
    p_max_attempts integer[],
    p_dlqs         text[],
    p_now          timestamptz,
    p_fresh_ids    boolean DEFAULT false,
    p_data_bytes   bytea[] DEFAULT NULL
) RETURNS TABLE (ord integer, "offset" bigint, message_id text, duplicate boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz;
    v_q      streamd.queues;
    v_n      integer := coalesce(cardinality(p_data), 0);
    v_ids    text[];
    v_dlq    text;
    v_new    text[];
    v_offs   bigint[];
    v_all    bigint[];
    v_hidden text;
    v_stored bigint;
    v_tenant text := nullif(current_setting('streamd.tenant_id', true), '');
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1396986164, hashtext(p_queue)); -- see queue_lock_shared
    v_now := coalesce(p_now, clock_timestamp()); -- after the lock (the clock rule)
    SELECT * INTO v_q FROM streamd.queues q WHERE q.queue_name = p_queue;
    IF NOT FOUND THEN
        v_q := streamd.queue_get(p_queue); -- raises SD201 or SD202
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF (p_ids IS NOT NULL AND cardinality(p_ids) <> v_n)
       OR (p_metadata IS NOT NULL AND cardinality(p_metadata) <> v_n)
       OR (p_delays_ms IS NOT NULL AND cardinality(p_delays_ms) <> v_n)
       OR (p_deliver_at IS NOT NULL AND cardinality(p_deliver_at) <> v_n)
       OR (p_groups IS NOT NULL AND cardinality(p_groups) <> v_n)
       OR (p_max_attempts IS NOT NULL AND cardinality(p_max_attempts) <> v_n)
       OR (p_dlqs IS NOT NULL AND cardinality(p_dlqs) <> v_n)
       OR (p_data_bytes IS NOT NULL AND cardinality(p_data_bytes) <> v_n) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: send arrays must all have %s elements', p_queue, v_n);
    END IF;
    IF p_fresh_ids AND (p_ids IS NULL OR array_position(p_ids, NULL) IS NOT NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: fresh ids (p_fresh_ids) need every message id', p_queue);
    END IF;

    -- The common batch (fresh ids, data only, a standard queue) is one INSERT: each
    -- message's checks ride on it, and a message that fails them hands the batch to
    -- queue_send_check, which raises its error (undoing the rows already inserted).
    IF p_fresh_ids AND NOT v_q.fifo AND p_metadata IS NULL AND p_delays_ms IS NULL
       AND p_deliver_at IS NULL AND p_groups IS NULL AND p_max_attempts IS NULL AND p_dlqs IS NULL
       AND p_data_bytes IS NULL THEN
        v_offs := streamd.queue_take_offsets(v_q.offset_seq, v_n);
        INSERT INTO streamd.queue_messages AS m (stream_name, "offset", message_id, data, enqueued_at, visibility_timeout,
                                                 tenant_id)
        SELECT p_queue, u.o,
               CASE WHEN u.id IS NULL OR u.id = '' OR length(u.id) > 512
                         OR u.d IS NULL OR octet_length(u.d) > v_q.max_payload_bytes
                    THEN streamd.queue_send_check(v_q, p_ids, p_data, NULL, NULL, NULL, NULL)
                    ELSE u.id END,
               u.d::jsonb, v_now, v_now, v_tenant
        FROM unnest(v_offs, p_ids, p_data) u(o, id, d);
        RETURN QUERY SELECT u.i::integer, u.o, u.id, false FROM unnest(v_offs, p_ids) WITH ORDINALITY u(o, id, i);
        RETURN;
    END IF;
    -- The common FIFO batch (fresh ids, data and group keys only) likewise: the group
    -- keys' checks ride on the groups' lock, the rest on the INSERT, and the first
    -- message that fails one hands the batch to queue_send_check (payload errors
    -- first, as below). No delay: every message and every new group is visible now.
    IF p_fresh_ids AND v_q.fifo AND p_groups IS NOT NULL AND p_metadata IS NULL AND p_delays_ms IS NULL
       AND p_deliver_at IS NULL AND p_max_attempts IS NULL AND p_dlqs IS NULL AND p_data_bytes IS NULL THEN
        -- Lock (or create) the groups in key order, as below. A group that holds
        -- messages is only locked (WHERE false): its row does not change.
        INSERT INTO streamd.message_groups AS g (stream_name, group_key, tenant_id, visible_at)
        SELECT p_queue,
               CASE WHEN s.k IS NULL OR s.k = '' OR length(s.k) > 512
                    THEN streamd.queue_send_check(v_q, p_ids, p_data, NULL, NULL, NULL, p_groups)
                    ELSE s.k END,
               coalesce(v_tenant, ''), v_now
        FROM (SELECT DISTINCT u.g AS k FROM unnest(p_groups) u(g)) s
        ORDER BY s.k
        ON CONFLICT (stream_name, group_key, tenant_id) DO UPDATE SET visible_at = g.visible_at WHERE false;
        v_now := coalesce(p_now, clock_timestamp()); -- after the group locks (the clock rule)
        v_offs := streamd.queue_take_offsets(v_q.offset_seq, v_n);
        INSERT INTO streamd.queue_messages AS m (stream_name, "offset", message_id, data, enqueued_at, visibility_timeout,
                                                 group_key, tenant_id)
        SELECT p_queue, u.o,
               CASE WHEN u.id IS NULL OR u.id = '' OR length(u.id) > 512
                         OR u.d IS NULL OR octet_length(u.d) > v_q.max_payload_bytes
                    THEN streamd.queue_send_check(v_q, p_ids, p_data, NULL, NULL, NULL, p_groups)
                    ELSE u.id END,
               u.d::jsonb, v_now, v_now, u.g, v_tenant
        FROM unnest(v_offs, p_ids, p_data, p_groups) u(o, id, d, g);
        RETURN QUERY SELECT u.i::integer, u.o, u.id, false FROM unnest(v_offs, p_ids) WITH ORDINALITY u(o, id, i);
        RETURN;
    END IF;
    PERFORM streamd.queue_send_check(v_q, p_ids, p_data, p_metadata, p_delays_ms, p_max_attempts, p_groups, p_data_bytes);
    IF p_dlqs IS NOT NULL THEN
        FOR v_dlq IN SELECT DISTINCT d FROM unnest(p_dlqs) d WHERE d IS NOT NULL LOOP
            IF v_dlq = p_queue THEN
                RAISE EXCEPTION USING ERRCODE = 'SD204', MESSAGE = format('queue %L cannot be its own dead-letter queue', p_queue);
            END IF;
            IF (streamd.queue_get(v_dlq)).fifo THEN
                RAISE EXCEPTION USING ERRCODE = 'SD204', MESSAGE = format('dead-letter queue %L is FIFO; it must be standard', v_dlq);
            END IF;
        END LOOP;
    END IF;

    IF v_q.fifo THEN
        -- Lock (or create) the groups in key order before inserting, so that sends to
        -- one group commit one at a time and offsets in a group follow commit order.
        -- The groups are the sender's tenant's, as the messages are.
        INSERT INTO streamd.message_groups AS g (stream_name, group_key, tenant_id, visible_at)
        SELECT p_queue, s.k, coalesce(v_tenant, ''), s.v FROM (
            SELECT DISTINCT ON (u.g) u.g AS k,
                   coalesce(u.da, v_now + make_interval(secs => coalesce(u.dl, 0) / 1000.0)) AS v
            FROM unnest(p_groups, p_deliver_at, p_delays_ms) WITH ORDINALITY u(g, da, dl, i) ORDER BY u.g, u.i) s
        ORDER BY s.k
        ON CONFLICT (stream_name, group_key, tenant_id) DO UPDATE SET visible_at = g.visible_at WHERE false;
        v_now := coalesce(p_now, clock_timestamp()); -- after the group locks (the clock rule)
    END IF;

    -- Offsets in batch order, taken after the group locks: within a group, they
    -- follow commit order. A message a standard queue cannot deliver yet goes to the
    -- delayed lane: its offset is the sequence's plus 2^52 (migration 0099), after
    -- every undelayed message's, so that receives do not read past it; they find it
    -- through queue_messages_due once it is due (due_at, set here and never updated:
    -- migration 0120).
    v_all := ARRAY(SELECT u.o
                          + CASE WHEN NOT v_q.fifo
                                      AND coalesce(p_deliver_at[u.i], v_now + make_interval(secs => coalesce(p_delays_ms[u.i], 0) / 1000.0)) > v_now
                                 THEN 4503599627370496 ELSE 0 END
                   FROM unnest(streamd.queue_take_offsets(v_q.offset_seq, v_n)) WITH ORDINALITY u(o, i));
    IF p_fresh_ids THEN
        -- Every id is new: no conflict to look for.
        INSERT INTO streamd.queue_messages AS m (stream_name, "offset", message_id, data, metadata, enqueued_at,
                                                 visibility_timeout, max_delivery_attempts, dead_letter_stream, group_key,
                                                 tenant_id, data_bytes, due_at)
        SELECT p_queue, u.o, u.id, u.d::jsonb, u.md::jsonb, v_now,
               coalesce(u.da, v_now + make_interval(secs => coalesce(u.dl, 0) / 1000.0)),
               u.ma, u.dq, u.g, v_tenant, u.b,
               CASE WHEN u.o >= 4503599627370496 THEN coalesce(u.da, v_now + make_interval(secs => coalesce(u.dl, 0) / 1000.0)) END
        FROM unnest(v_all, p_ids, p_data, p_metadata, p_delays_ms, p_deliver_at, p_groups, p_max_attempts, p_dlqs, p_data_bytes)
             u(o, id, d, md, dl, da, g, ma, dq, b);
        RETURN QUERY SELECT u.i::integer, u.o, u.id, false FROM unnest(v_all, p_ids) WITH ORDINALITY u(o, id, i);
        RETURN;
    END IF;

    -- unnest reads its arrays in order: no ordinality, join or sort is needed to keep
    -- the batch's order (the first of two messages with one id is the one stored).
    v_ids := CASE WHEN p_ids IS NOT NULL AND array_position(p_ids, NULL) IS NULL THEN p_ids
                  ELSE ARRAY(SELECT coalesce(u.id, gen_random_uuid()::text) FROM unnest(p_ids, p_data) u(id, d)) END;
    INSERT INTO streamd.queue_messages AS m (stream_name, "offset", message_id, data, metadata, enqueued_at,
                                             visibility_timeout, max_delivery_attempts, dead_letter_stream, group_key,
                                             dedup, tenant_id, data_bytes, due_at)
    SELECT p_queue, u.o, u.id, u.d::jsonb, u.md::jsonb, v_now,
           coalesce(u.da, v_now + make_interval(secs => coalesce(u.dl, 0) / 1000.0)),
           u.ma, u.dq, u.g, u.named IS NOT NULL, v_tenant, u.b,
           CASE WHEN u.o >= 4503599627370496 THEN coalesce(u.da, v_now + make_interval(secs => coalesce(u.dl, 0) / 1000.0)) END
    FROM unnest(v_all, p_ids, v_ids, p_data, p_metadata, p_delays_ms, p_deliver_at, p_groups, p_max_attempts, p_dlqs, p_data_bytes)
         u(o, named, id, d, md, dl, da, g, ma, dq, b)
    ON CONFLICT (message_id, stream_name) WHERE dedup DO NOTHING;
    GET DIAGNOSTICS v_stored = ROW_COUNT;
    IF v_stored = v_n THEN
        -- Every message was stored (no duplicate, within the batch or of a held
        -- message): each has the offset taken for it.
        RETURN QUERY SELECT u.i::integer, u.o, u.id, false FROM unnest(v_all, v_ids) WITH ORDINALITY u(o, id, i);
        RETURN;
    END IF;
    -- What was stored: the rows with this batch's offsets (this statement sees them).
    SELECT array_agg(m.message_id), array_agg(m."offset") INTO v_new, v_offs
    FROM streamd.queue_messages m WHERE m.stream_name = p_queue AND m."offset" = ANY(v_all);

    -- A tenant role cannot see another tenant's messages (nor those without a tenant),
    -- but the dedup index holds every tenant's ids: a send of an id such a message
    -- holds stored nothing, and reporting it as a duplicate (of no offset) lost the
    -- message and let any tenant block another's ids. It is refused instead, and
    -- nothing of the batch is written. (An original of the role's own that was acked
    -- between the insert and this statement is refused the same way; a retry then
    -- stores the message, as it would have after the ack.)
    IF coalesce(cardinality(v_new), 0) < v_n THEN
        IF streamd.current_tenant() IS NOT NULL THEN
            SELECT v.id INTO v_hidden FROM unnest(v_ids) WITH ORDINALITY v(id, i)
            WHERE v.id <> ALL(coalesce(v_new, '{}'))
              AND NOT EXISTS (SELECT 1 FROM streamd.queue_messages e
                              WHERE e.message_id = v.id AND e.stream_name = p_queue AND e.dedup)
            ORDER BY v.i LIMIT 1;
            IF v_hidden IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'SD204',
                    MESSAGE = format('queue %L: message id %L is already used in this queue by a message this role cannot see (another tenant''s)',
                                     p_queue, v_hidden);
            END IF;
        END IF;
    END IF;

    -- A new statement: it sees duplicates' originals even when they committed while
    -- the insert waited for them. Each original is one probe of the unique index.
    RETURN QUERY
    SELECT v.i::integer,
           coalesce(n.o, (SELECT e."offset" FROM streamd.queue_messages e
                          WHERE e.message_id = v.id AND e.stream_name = p_queue AND e.dedup)),
           v.id,
           n.o IS NULL OR v.i <> min(v.i) OVER (PARTITION BY v.id)
    FROM unnest(v_ids) WITH ORDINALITY v(id, i)
    LEFT JOIN unnest(v_new, v_offs) n(id, o) ON n.id = v.id
    ORDER BY v.i;
END;
$$;

-- The blocks of offsets of a batch of p_n messages, from the queue's sequence p_seq:
-- one nextval per block of 128 messages instead of one per message (migration 0205).
-- A queue's sequence counts in steps of 128, so each nextval reserves the 128 offsets
-- from the value it returns; message i (0-based) of the batch gets block i / 128 plus
-- i % 128 (queue_take_offsets). A batch of up to 128 takes one nextval and its offsets
-- are consecutive whatever other sends take meanwhile (one nextval per message let
-- concurrent sends interleave). A call that takes a single offset (nextval) reserves
-- a block and uses its first: offsets are unique and grow with each take; they are
-- not dense. messages/send.go's sendDirectSQL calls this and expands the blocks the
-- same way (offsetBlock); a client that does so fails on a database without it
-- (migrate first), rather than take consecutive values of a sequence counting in ones.
-- Written as a loop of simple expressions, which PL/pgSQL evaluates without starting
-- an executor: as ARRAY(SELECT nextval ... FROM generate_series(...)) the call cost
-- the server about what the nextvals it saved had (bench/RESULTS.md, session 15).
CREATE OR REPLACE FUNCTION streamd.queue_offset_blocks(p_seq regclass, p_n integer) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_blocks bigint[] := '{}';
BEGIN
    FOR i IN 1 .. (p_n + 127) / 128 LOOP
        v_blocks := v_blocks || nextval(p_seq);
    END LOOP;
    RETURN v_blocks;
END;
$$;

-- A batch's offsets in batch order (queue_offset_blocks, expanded).
CREATE OR REPLACE FUNCTION streamd.queue_take_offsets(p_seq regclass, p_n integer) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_blocks bigint[] := streamd.queue_offset_blocks(p_seq, p_n);
BEGIN
    RETURN ARRAY(SELECT v_blocks[i / 128 + 1] + i % 128 FROM generate_series(0, p_n - 1) i);
END;
$$;

-- The queue a direct send inserts into (messages/send.go, sendDirectSQL): takes the
-- queue's lock shared (queue_lock_shared) and then reads the queue's row, in a
-- statement of its own, so under READ COMMITTED the row is read with a snapshot taken
-- after the lock: a send never inserts into a queue whose deletion committed while it
-- waited. Returns NULL (a row of NULLs) when there is no such queue; the caller then
-- calls queue_send, which raises the typed error.
CREATE OR REPLACE FUNCTION streamd.queue_send_target(p_queue text) RETURNS streamd.queues
LANGUAGE plpgsql AS $$
DECLARE
    v_q streamd.queues;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1396986164, hashtext(p_queue)); -- see queue_lock_shared
    SELECT * INTO v_q FROM streamd.queues q WHERE q.queue_name = p_queue;
    RETURN v_q;
END;
$$;

-- Moves messages of p_queue (locked by the caller) to their dead-letter queues in one
-- statement (Q2), keeping their provenance: origin queue and offset, attempts, last
-- error (p_errors, parallel to p_offsets, overrides it). A message's dead-letter queue
-- is its own (an override given at send) or else its queue's. A message without one
-- is deleted when p_discard and left alone otherwise. A message id the dead-letter
-- queue already holds gets the suffix "@<queue>:<offset>". An offset may be named more
-- than once (its first error counts); the message moves once. In the dead-letter
-- queue, the message gets an offset of that queue and follows its settings. Returns
-- the number of messages moved or discarded.
CREATE OR REPLACE FUNCTION streamd.queue_dead_letter(
    p_queue text, p_offsets bigint[], p_errors text[], p_discard boolean, p_now timestamptz
) RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    v_n     integer;
    v_moved jsonb;
    v_force boolean := false;
    v_qdlq  text;
BEGIN
    SELECT q.dead_letter_queue INTO v_qdlq FROM streamd.queues q WHERE q.queue_name = p_queue;
    PERFORM streamd.queue_lock_shared(ARRAY(SELECT DISTINCT coalesce(m.dead_letter_stream, v_qdlq) FROM streamd.queue_messages m
                                            WHERE m.stream_name = p_queue AND m."offset" = ANY(p_offsets)));
    -- The check for an id the dead-letter queue holds cannot see a send (or another
    -- move) of that id not yet committed: the insert then waits for it and, once it
    -- commits, fails on the dedup index. The move is then made again with every named
    -- id suffixed (the suffix names the message's origin, so it is free). The
    -- subtransaction costs only this path.
    LOOP
    BEGIN
    WITH d AS (
        DELETE FROM streamd.queue_messages m
        WHERE m.stream_name = p_queue AND m."offset" = ANY(p_offsets)
          AND (p_discard OR streamd.queue_dlq_ok(coalesce(m.dead_letter_stream, v_qdlq)))
        RETURNING m.*, coalesce(m.dead_letter_stream, v_qdlq) AS dlq
    ), ins AS (
        INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, metadata, enqueued_at,
                                            visibility_timeout, group_key, last_error, origin_stream, origin_offset,
                                            origin_attempts, dead_lettered_at, dedup, tenant_id, data_bytes)
        SELECT d.dlq, nextval(dq.offset_seq),
               CASE WHEN d.dedup AND (v_force OR EXISTS (SELECT 1 FROM streamd.queue_messages x
                                             WHERE x.message_id = d.message_id AND x.stream_name = d.dlq
                                               AND x.dedup))
                    THEN d.message_id || '@' || p_queue || ':' || d."offset" ELSE d.message_id END,
               d.data, d.metadata, d.enqueued_at, v_now, d.group_key,
               coalesce(e.err, d.last_error), p_queue, d."offset", d.delivery_attempts, v_now, d.dedup, d.tenant_id,
               d.data_bytes
        FROM d
        JOIN streamd.queues dq ON dq.queue_name = d.dlq AND NOT dq.fifo
        -- One error per offset: an offset named twice (a receipt repeated in one nack
        -- or term) would otherwise insert the message twice (Q2).
        LEFT JOIN (SELECT DISTINCT ON (u.o) u.o, u.err
                   FROM unnest(p_offsets, coalesce(p_errors, '{}'::text[])) WITH ORDINALITY u(o, err, i)
                   ORDER BY u.o, u.i) e ON e.o = d."offset"
        ORDER BY d."offset"
        RETURNING stream_name, "offset", message_id, origin_offset, origin_attempts, last_error, dead_lettered_at, tenant_id
    )
    SELECT (SELECT count(*) FROM d),
           (SELECT jsonb_agg(jsonb_build_object('dead_letter_queue', i.stream_name, 'dead_letter_offset', i."offset",
                                                'message_id', i.message_id, 'origin_offset', i.origin_offset,
                                                'attempts', i.origin_attempts, 'error', i.last_error,
                                                'dead_lettered_at', i.dead_lettered_at, 'tenant_id', i.tenant_id)
                             ORDER BY i.origin_offset)
              FROM ins i)
      INTO v_n, v_moved;
    PERFORM streamd.queue_dead_lettered(p_queue, v_moved);
    RETURN v_n;
    EXCEPTION WHEN unique_violation THEN
        IF v_force THEN
            RAISE;
        END IF;
        v_force := true;
    END;
    END LOOP;
END;
$$;

-- Raises SD204 when a settlement names a negative offset (E1: offsets are never
-- negative), before anything is settled. queue_ack makes the same check inline.
CREATE OR REPLACE FUNCTION streamd.queue_check_offsets(p_queue text, p_offsets bigint[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_lo bigint;
BEGIN
    SELECT min(o) INTO v_lo FROM unnest(p_offsets) o;
    IF v_lo < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: receipt offset %s is negative', p_queue, v_lo);
    END IF;
END;
$$;

-- Locks the FIFO groups of the messages named by (offset, token), in (key, tenant)
-- order, and returns their keys and tenants (parallel arrays, for
-- queue_groups_advance).
--
-- plpgsql, not a SQL function: a SQL function with SET options is never inlined, and
-- before PostgreSQL 18 it is planned again at every call (a cached plan lives only as
-- long as the calling statement): an ack's group lock of 100 took 15.5 ms, 0.95 ms
-- now (bench/RESULTS.md, session 9). The messages are read by the primary key
-- (offset = ANY): the join to the receipts it replaces, planned generically, probed
-- queue_messages_group, whose offset is its fourth column, once per receipt.
CREATE OR REPLACE FUNCTION streamd.queue_lock_groups(p_queue text, p_offsets bigint[], p_tokens uuid[],
                                                     OUT keys text[], OUT tenants text[])
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off SET enable_bitmapscan = off
    SET enable_hashjoin = off SET enable_mergejoin = off AS $$
DECLARE
    v_keys text[];
    v_tens text[];
BEGIN
    -- (group_key IS NOT NULL is a FILTER, not in the WHERE clause: there, it let the
    -- planner take the partial queue_messages_group index, offset = ANY as its
    -- fourth column.)
    SELECT array_agg(m.group_key) FILTER (WHERE m.group_key IS NOT NULL),
           array_agg(coalesce(m.tenant_id, '')) FILTER (WHERE m.group_key IS NOT NULL)
    INTO v_keys, v_tens
    FROM streamd.queue_messages m
    WHERE m.stream_name = p_queue AND m."offset" = ANY(p_offsets) AND m.lease_token = ANY(p_tokens);
    IF v_keys IS NULL THEN
        keys := '{}';
        tenants := '{}';
        RETURN;
    END IF;
    -- One locking probe of the primary key per group, in key order (the lateral
    -- subquery, which its FOR UPDATE keeps from being pulled up, runs once per key
    -- of the sorted list): as a join, the planner scanned every group of the queue
    -- and compared each with every key whenever its statistics made the queue look
    -- small (bench/RESULTS.md, "Issue 22, session 15 (fifo15)").
    SELECT coalesce(array_agg(l.group_key ORDER BY l.group_key, l.tenant_id), '{}'),
           coalesce(array_agg(l.tenant_id ORDER BY l.group_key, l.tenant_id), '{}')
    INTO keys, tenants
    FROM (SELECT DISTINCT k.key, k.ten FROM unnest(v_keys, v_tens) k(key, ten) ORDER BY k.key, k.ten) k
    CROSS JOIN LATERAL (SELECT g.group_key, g.tenant_id FROM streamd.message_groups g
                        WHERE g.stream_name = p_queue AND g.group_key = k.key AND g.tenant_id = k.ten
                        FOR UPDATE) l;
END;
$$;

-- Brings FIFO groups (locked by the caller; p_groups and p_tenants are parallel:
-- group key and group tenant_id) up to date after their messages changed: an empty
-- group's row goes; otherwise the group may deliver again at its head's visibility
-- time, and not before now (so a settled group goes to the back of the round robin).
-- A group's messages are those of its tenant only, named in each statement: the owner
-- sees every tenant's messages, a tenant role only its own.
CREATE OR REPLACE FUNCTION streamd.queue_groups_advance(p_queue text, p_groups text[], p_tenants text[], p_now timestamptz)
RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    -- One statement, one head lookup per group: a group without a head goes, the
    -- others get their head's time (the group rows are locked, so no send to them can
    -- commit meanwhile, and their ctids hold). Each group's row is found by a probe
    -- of the primary key of its own (the lateral subquery, kept from being pulled up
    -- by its OFFSET) and written by its ctid, as queue_ack does: joined to the keys,
    -- the planner scanned every group of the queue whenever its statistics made the
    -- queue look small (bench/RESULTS.md, "Issue 22, session 15 (fifo15)").
    WITH h AS MATERIALIZED (
        SELECT g.c,
               (SELECT m.visibility_timeout FROM streamd.queue_messages m
                WHERE m.stream_name = p_queue AND m.group_key = k.key AND coalesce(m.tenant_id, '') = k.ten
                ORDER BY m."offset" LIMIT 1) AS vis
        FROM unnest(p_groups, p_tenants) k(key, ten)
        CROSS JOIN LATERAL (SELECT g.ctid AS c FROM streamd.message_groups g
                            WHERE g.stream_name = p_queue AND g.group_key = k.key AND g.tenant_id = k.ten
                            OFFSET 0) g
    ), gone AS (
        DELETE FROM streamd.message_groups g
        WHERE g.ctid = ANY(ARRAY(SELECT h.c FROM h WHERE h.vis IS NULL))
    )
    UPDATE streamd.message_groups g SET visible_at = greatest(v_now, h.vis), lease_end = NULL
    FROM h
    WHERE g.ctid = h.c AND h.vis IS NOT NULL;
END;
$$;

-- Receives up to p_max visible messages of a queue and leases them for p_vt_ms (NULL:
-- the queue's visibility timeout): each gets delivery_attempts + 1 and a new lease
-- token. A message already delivered as many times as its max delivery attempts (its
-- own, or else the queue's) that has a dead-letter queue is moved there instead (Q2),
-- in this same transaction.
--
-- Standard queue: visible messages in offset order, locked with SKIP LOCKED, read
-- from the primary key (migration 0086: there is no ready index). The scan reads past
-- what is not visible: messages in flight, delayed by a send or a nack, and rows other
-- receives hold locked; each costs a heap fetch of well under a microsecond. The
-- lease is a HOT update (no indexed column changes) of the rows by ctid: we hold
-- their locks, so they cannot have moved.
-- FIFO queue: up to p_max groups that may deliver, least recently served first, locked
-- with SKIP LOCKED; of each, only the head (lowest offset) is leased, so a group never
-- has two messages in flight.
--
-- Lease tokens: one random UUID per call, not per message. A message's token is that
-- UUID with the message's offset XORed into its last eight bytes, so the tokens of one
-- call differ from each other (their offsets do), a delivery's token differs from every
-- other delivery's but with the chance of two random UUIDs colliding, and the token is
-- still a version-4 UUID (offsets are below 2^53: the variant bits are untouched).
-- gen_random_uuid() costs a getpid() system call in OpenSSL's generator: 7.5 to 30 µs
-- each on the 2-core VM, as much as the rest of a receive of 100 together
-- (bench/RESULTS.md, "Issue 22, session 10").
CREATE OR REPLACE FUNCTION streamd.queue_receive(p_queue text, p_max integer, p_vt_ms bigint, p_now timestamptz)
RETURNS TABLE ("offset" bigint, message_id text, data jsonb, metadata jsonb, enqueued_at timestamptz,
               visibility_timeout timestamptz, delivery_attempts integer, max_delivery_attempts integer,
               lease_token uuid, group_key text, last_error text, origin_stream text, origin_offset bigint,
               origin_attempts integer, dead_lettered_at timestamptz, data_bytes bytea)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off SET enable_bitmapscan = off
    SET enable_hashjoin = off SET enable_mergejoin = off AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := coalesce(p_now, clock_timestamp());
    v_q      streamd.queues;
    v_lease  timestamptz;
    v_ctids  tid[];
    v_dead   bigint[];
    v_groups text[];
    v_tens   text[];
    v_tok    bytea := uuid_send(gen_random_uuid()); -- the lease tokens' random base, once per call
    v_tok_lo bigint;
BEGIN
    SELECT * INTO v_q FROM streamd.queues q WHERE q.queue_name = p_queue;
    IF NOT FOUND THEN
        v_q := streamd.queue_get(p_queue); -- raises SD201 or SD202
    END IF;
    v_tok_lo := ('x' || encode(substr(v_tok, 9, 8), 'hex'))::bit(64)::bigint;
    v_tok := substr(v_tok, 1, 8);
    IF p_max IS NULL OR p_max < 1 OR p_max > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: receive max %s must be between 1 and 10000', p_queue, p_max);
    END IF;
    IF p_vt_ms IS NOT NULL AND p_vt_ms <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: visibility timeout %s ms must be positive', p_queue, p_vt_ms);
    END IF;
    v_lease := v_now + make_interval(secs => coalesce(p_vt_ms, v_q.visibility_timeout_ms) / 1000.0);

    IF NOT v_q.fifo THEN
        -- Due messages of the delayed lane first (through their partial index, in
        -- due order; it is empty unless the queue has delayed sends), then the rest
        -- in offset order, below the lane. The outer LIMIT stops pulling (and
        -- locking) once it has p_max.
        SELECT array_agg(c.ctid) FILTER (WHERE NOT c.exhausted), array_agg(c.o) FILTER (WHERE c.exhausted)
        INTO v_ctids, v_dead
        FROM ((SELECT * FROM (SELECT m.ctid, m."offset" AS o,
                      (m.delivery_attempts >= coalesce(m.max_delivery_attempts, v_q.max_delivery_attempts)
                       AND streamd.queue_dlq_ok(coalesce(m.dead_letter_stream, v_q.dead_letter_queue))) AS exhausted
               FROM streamd.queue_messages m
               WHERE m.stream_name = p_queue AND m."offset" >= 4503599627370496 AND m.due_at <= v_now
                 AND m.visibility_timeout <= v_now
               ORDER BY m.due_at
               LIMIT p_max
               FOR UPDATE SKIP LOCKED) lane)
              UNION ALL
              (SELECT * FROM (SELECT m.ctid, m."offset" AS o,
                      (m.delivery_attempts >= coalesce(m.max_delivery_attempts, v_q.max_delivery_attempts)
                       AND streamd.queue_dlq_ok(coalesce(m.dead_letter_stream, v_q.dead_letter_queue))) AS exhausted
               FROM streamd.queue_messages m
               WHERE m.stream_name = p_queue AND m."offset" < 4503599627370496 AND m.visibility_timeout <= v_now
               ORDER BY m."offset"
               LIMIT p_max
               FOR UPDATE SKIP LOCKED) head)
              LIMIT p_max) c;
    ELSE
        -- The groups that may deliver, least recently served first, locked (SKIP
        -- LOCKED) and written in one statement: each may deliver again when the lease
        -- of its head ends. When a head is not leased (dead-lettered, not visible yet,
        -- or gone), queue_groups_advance below sets its group right. (Locking them
        -- first and writing them after the lease cost a lock record and a second
        -- statement per receive.) The lease's end goes to lease_end, a column of no
        -- index, so the write is HOT (migration 0195): a group in flight keeps its
        -- place in message_groups_ready and receives read past it, as a standard
        -- receive reads past messages in flight; a settlement moves it to the back.
        -- Generic plans for statements of message_groups alone (migration 0150's
        -- n_distinct = 1 makes a queue the whole table to them; a custom plan takes
        -- the queue name's own estimate, a handful of groups, and read every group of
        -- the queue); custom plans for queue_messages (migration 0215: a generic plan
        -- locks every queue's partition).
        PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
        WITH u AS (
            UPDATE streamd.message_groups g SET lease_end = v_lease
            WHERE g.ctid = ANY(ARRAY(
                SELECT l.ctid FROM streamd.message_groups l
                WHERE l.stream_name = p_queue AND l.visible_at <= v_now
                  AND (l.lease_end IS NULL OR l.lease_end <= v_now)
                ORDER BY l.visible_at, l.group_key
                LIMIT p_max
                FOR UPDATE SKIP LOCKED))
            RETURNING g.group_key, g.tenant_id)
        SELECT array_agg(u.group_key), array_agg(u.tenant_id) INTO v_groups, v_tens FROM u;
        PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
        IF v_groups IS NULL THEN
            RETURN;
        END IF;
        -- A new statement, taken after the group locks: it sees every settlement of
        -- these groups, and none can start until we commit. The heads are leased by
        -- the ctids found here (the group locks keep them in place), as a standard
        -- receive leases what it locked, not by a second descent of the primary key.
        SELECT array_agg(h.c) FILTER (WHERE NOT h.exhausted AND h.vis <= v_now),
               array_agg(h.o) FILTER (WHERE h.exhausted AND h.vis <= v_now)
        INTO v_ctids, v_dead
        FROM unnest(v_groups, v_tens) k(key, ten)
        CROSS JOIN LATERAL (
            SELECT m.ctid AS c, m."offset" AS o, m.visibility_timeout AS vis,
                   (m.delivery_attempts >= coalesce(m.max_delivery_attempts, v_q.max_delivery_attempts)
                    AND streamd.queue_dlq_ok(coalesce(m.dead_letter_stream, v_q.dead_letter_queue))) AS exhausted
            FROM streamd.queue_messages m
            WHERE m.stream_name = p_queue AND m.group_key = k.key AND coalesce(m.tenant_id, '') = k.ten
            ORDER BY m."offset" LIMIT 1) h;
    END IF;

    IF v_dead IS NOT NULL THEN
        PERFORM streamd.queue_dead_letter(p_queue, v_dead, NULL, false, v_now);
    END IF;
    IF v_ctids IS NOT NULL THEN
        RETURN QUERY
        UPDATE streamd.queue_messages m
        SET delivery_attempts = m.delivery_attempts + 1, visibility_timeout = v_lease,
            lease_token = encode(v_tok || int8send(v_tok_lo # m."offset"), 'hex')::uuid
        WHERE m.stream_name = p_queue AND m.ctid = ANY(v_ctids) -- a ctid is a partition's
        RETURNING m."offset", m.message_id, m.data, m.metadata, m.enqueued_at, m.visibility_timeout,
                  m.delivery_attempts, coalesce(m.max_delivery_attempts, v_q.max_delivery_attempts), m.lease_token,
                  m.group_key, m.last_error, m.origin_stream, m.origin_offset, m.origin_attempts, m.dead_lettered_at,
                  m.data_bytes;
    END IF;
    IF v_q.fifo AND (v_dead IS NOT NULL OR coalesce(cardinality(v_ctids), 0) < cardinality(v_groups)) THEN
        -- Not every group's head was leased: those groups deliver at their head's
        -- time, or go when empty.
        PERFORM streamd.queue_groups_advance(p_queue, v_groups, v_tens, v_now);
    END IF;
END;
$$;

-- Acks (deletes) the messages named by (offset, token) and returns the receipts it
-- settled; a receipt missing from the result was stale.
CREATE OR REPLACE FUNCTION streamd.queue_ack(p_queue text, p_offsets bigint[], p_tokens uuid[], p_now timestamptz)
RETURNS TABLE ("offset" bigint, lease_token uuid)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off SET enable_bitmapscan = off
    SET enable_hashjoin = off SET enable_mergejoin = off AS $$
#variable_conflict use_column
DECLARE
    v_q      streamd.queues;
    v_groups text[];
    v_tens   text[];
    v_gctids tid[];
    v_now    timestamptz;
    v_lo     bigint;
    v_hi     bigint;
BEGIN
    SELECT * INTO v_q FROM streamd.queues q WHERE q.queue_name = p_queue;
    IF NOT FOUND THEN
        v_q := streamd.queue_get(p_queue); -- raises SD201 or SD202
    END IF;
    SELECT min(o), max(o) INTO v_lo, v_hi FROM unnest(p_offsets) o;
    -- Offsets are never negative (E1); refused before anything is settled. This also
    -- keeps v_hi - v_lo within bigint (it overflowed for MaxInt64 and -MaxInt64,
    -- an untyped 22003 that acked none of the valid receipts).
    IF v_lo < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: receipt offset %s is negative', p_queue, v_lo);
    END IF;
    IF v_q.fifo THEN
        -- queue_lock_groups, keeping the locked rows' ctids: the advance below writes
        -- them by ctid, not by a second lookup of their key. The receipts' groups are
        -- read first, on their own, by the primary key: joined to message_groups in
        -- the lock statement, the join's group_key = ... let the planner take the
        -- partial queue_messages_group index with the offsets as its fourth column,
        -- which read every FIFO message of the queue (1,105 buffers, 16 ms for an ack
        -- of 100 in a queue of 2,000).
        SELECT array_agg(m.group_key) FILTER (WHERE m.group_key IS NOT NULL),
               array_agg(coalesce(m.tenant_id, '')) FILTER (WHERE m.group_key IS NOT NULL)
        INTO v_groups, v_tens
        FROM streamd.queue_messages m
        WHERE m.stream_name = p_queue AND m."offset" = ANY(p_offsets) AND m.lease_token = ANY(p_tokens);
        IF v_groups IS NOT NULL THEN
            -- A locking probe of the primary key per group, in key order, as in
            -- queue_lock_groups (a join scanned the queue's groups: 32 ms per ack of
            -- 100 in a queue of 1,000 groups).
            PERFORM set_config('plan_cache_mode', 'force_generic_plan', true); -- as in queue_receive
            SELECT array_agg(l.group_key), array_agg(l.tenant_id), array_agg(l.ctid) INTO v_groups, v_tens, v_gctids
            FROM (SELECT DISTINCT k.key, k.ten FROM unnest(v_groups, v_tens) k(key, ten) ORDER BY k.key, k.ten) k
            CROSS JOIN LATERAL (SELECT g.group_key, g.tenant_id, g.ctid FROM streamd.message_groups g
                                WHERE g.stream_name = p_queue AND g.group_key = k.key AND g.tenant_id = k.ten
                                FOR UPDATE) l;
            PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
        END IF;
    END IF;
    -- The token check is a filter (as a join, the planner could scan the whole queue
    -- to hash it). A token is made for one delivery of one message (queue_receive:
    -- a random UUID per receive, the offset XORed in), so a row whose token is among
    -- p_tokens is named by that receipt (p_offsets may repeat, with a stale and a
    -- current token).
    IF v_hi - v_lo < 4 * cardinality(p_offsets) + 64 THEN
        -- The receipts of one receive are close together: one walk of the primary
        -- key over their range costs less than a descent per offset (8% of the send +
        -- receive + ack CPU). "+ 0" keeps the list out of the index condition.
        RETURN QUERY
        DELETE FROM streamd.queue_messages m
        WHERE m.stream_name = p_queue AND m."offset" BETWEEN v_lo AND v_hi
          AND m."offset" + 0 = ANY(p_offsets) AND m.lease_token = ANY(p_tokens)
        RETURNING m."offset", m.lease_token;
    ELSE
        RETURN QUERY
        DELETE FROM streamd.queue_messages m
        WHERE m.stream_name = p_queue AND m."offset" = ANY(p_offsets) AND m.lease_token = ANY(p_tokens)
        RETURNING m."offset", m.lease_token;
    END IF;
    IF v_groups IS NOT NULL THEN
        -- queue_groups_advance, by the ctids of the rows locked above.
        v_now := coalesce(p_now, clock_timestamp());
        WITH h AS MATERIALIZED (
            SELECT k.c, (SELECT m.visibility_timeout FROM streamd.queue_messages m
                         WHERE m.stream_name = p_queue AND m.group_key = k.key AND coalesce(m.tenant_id, '') = k.ten
                         ORDER BY m."offset" LIMIT 1) AS vis
            FROM unnest(v_gctids, v_groups, v_tens) k(c, key, ten)
        ), gone AS (
            DELETE FROM streamd.message_groups g
            WHERE g.ctid = ANY(ARRAY(SELECT h.c FROM h WHERE h.vis IS NULL))
        )
        UPDATE streamd.message_groups g SET visible_at = greatest(v_now, h.vis), lease_end = NULL
        FROM h
        WHERE g.ctid = h.c AND h.vis IS NOT NULL;
    END IF;
END;
$$;

-- Nacks the messages named by (offset, token): each becomes visible again after its
-- delay (p_delays_ms, parallel, NULL = 0) with its lease cleared, and records its
-- error. A message that has used up its delivery attempts and has a dead-letter queue
-- moves there now. Returns the settled receipts and whether each was dead-lettered.
CREATE OR REPLACE FUNCTION streamd.queue_nack(
    p_queue text, p_offsets bigint[], p_tokens uuid[], p_delays_ms bigint[], p_errors text[], p_now timestamptz
) RETURNS TABLE ("offset" bigint, lease_token uuid, dead_lettered boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := coalesce(p_now, clock_timestamp());
    v_q        streamd.queues;
    v_groups   text[];
    v_tens     text[];
    v_retry    bigint[];
    v_dead     bigint[];
    v_dead_err text[];
    v_offs     bigint[];
    v_toks     uuid[];
BEGIN
    v_q := streamd.queue_get(p_queue);
    PERFORM streamd.queue_check_offsets(p_queue, p_offsets);
    IF EXISTS (SELECT 1 FROM unnest(p_delays_ms) d WHERE d < 0) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204', MESSAGE = format('queue %L: nack delay is negative', p_queue);
    END IF;
    IF v_q.fifo THEN
        SELECT l.keys, l.tenants INTO v_groups, v_tens FROM streamd.queue_lock_groups(p_queue, p_offsets, p_tokens) l;
    END IF;
    SELECT array_agg(c.o) FILTER (WHERE NOT c.exhausted), array_agg(c.o) FILTER (WHERE c.exhausted),
           array_agg(c.err) FILTER (WHERE c.exhausted), array_agg(c.o), array_agg(c.t)
    INTO v_retry, v_dead, v_dead_err, v_offs, v_toks
    FROM (SELECT m."offset" AS o, r.e AS err, r.t,
                 (m.delivery_attempts >= coalesce(m.max_delivery_attempts, v_q.max_delivery_attempts)
                  AND streamd.queue_dlq_ok(coalesce(m.dead_letter_stream, v_q.dead_letter_queue))) AS exhausted
          FROM streamd.queue_messages m
          JOIN (SELECT DISTINCT ON (u.o, u.t) u.o, u.t, u.e
                FROM unnest(p_offsets, p_tokens, p_errors) WITH ORDINALITY u(o, t, e, i)
                ORDER BY u.o, u.t, u.i) r ON m."offset" = r.o AND m.lease_token = r.t
          WHERE m.stream_name = p_queue
          ORDER BY m."offset"
          FOR UPDATE OF m) c;
    v_now := coalesce(p_now, clock_timestamp()); -- after the group and message locks (the clock rule)
    IF v_dead IS NOT NULL THEN
        PERFORM streamd.queue_dead_letter(p_queue, v_dead, v_dead_err, false, v_now);
    END IF;
    IF v_retry IS NOT NULL THEN
        UPDATE streamd.queue_messages m
        SET visibility_timeout = v_now + make_interval(secs => coalesce(r.d, 0) / 1000.0),
            lease_token = NULL, last_error = coalesce(r.e, m.last_error)
        FROM (SELECT DISTINCT ON (u.o, u.t) u.o, u.t, u.d, u.e
              FROM unnest(p_offsets, p_tokens, p_delays_ms, p_errors) WITH ORDINALITY u(o, t, d, e, i)
              ORDER BY u.o, u.t, u.i) r
        WHERE m.stream_name = p_queue AND m."offset" = r.o AND m.lease_token = r.t AND r.o = ANY(v_retry);
    END IF;
    IF v_q.fifo THEN
        PERFORM streamd.queue_groups_advance(p_queue, v_groups, v_tens, v_now);
    END IF;
    RETURN QUERY SELECT x.o, x.t, coalesce(x.o = ANY(v_dead), false) FROM unnest(v_offs, v_toks) x(o, t);
END;
$$;

-- Releases the messages named by (offset, token) without spending a delivery attempt:
-- each becomes visible at once, in its old place (its offset), with its lease
-- cleared, its last error kept and its delivery_attempts taken back by the one its
-- receive counted. It never dead-letters. For a consumer that stops cleanly: messages
-- it received but never handed to a handler, or whose handler it interrupted, were
-- not a failed delivery, and counting them dead-lettered good messages after enough
-- restarts. Returns the receipts it settled (a missing one was stale).
CREATE OR REPLACE FUNCTION streamd.queue_release(p_queue text, p_offsets bigint[], p_tokens uuid[], p_now timestamptz)
RETURNS TABLE ("offset" bigint, lease_token uuid)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz;
    v_q      streamd.queues;
    v_groups text[];
    v_tens   text[];
    v_offs   bigint[];
    v_ids    text[];
BEGIN
    v_q := streamd.queue_get(p_queue);
    PERFORM streamd.queue_check_offsets(p_queue, p_offsets);
    IF v_q.fifo THEN
        SELECT l.keys, l.tenants INTO v_groups, v_tens FROM streamd.queue_lock_groups(p_queue, p_offsets, p_tokens) l;
    END IF;
    PERFORM 1 FROM streamd.queue_messages m
    WHERE m.stream_name = p_queue AND m."offset" = ANY(p_offsets) AND m.lease_token = ANY(p_tokens)
    ORDER BY m."offset"
    FOR UPDATE OF m;
    v_now := coalesce(p_now, clock_timestamp()); -- after the group and message locks (the clock rule)
    -- The same columns a receive changes: a HOT update, like the lease it undoes.
    RETURN QUERY
    WITH r AS (
        SELECT m."offset" AS o, m.lease_token AS t FROM streamd.queue_messages m
        WHERE m.stream_name = p_queue AND m."offset" = ANY(p_offsets) AND m.lease_token = ANY(p_tokens)
        ORDER BY m."offset"
        FOR UPDATE OF m)
    UPDATE streamd.queue_messages m
    SET visibility_timeout = v_now, lease_token = NULL, delivery_attempts = greatest(m.delivery_attempts - 1, 0)
    FROM r
    WHERE m.stream_name = p_queue AND m."offset" = r.o
    RETURNING r.o, r.t;
    IF v_q.fifo THEN
        PERFORM streamd.queue_groups_advance(p_queue, v_groups, v_tens, v_now);
    END IF;
END;
$$;

-- Extends the leases named by (offset, token) to now + p_vt_ms and returns the offsets
-- extended with their tokens and new visibility time.
CREATE OR REPLACE FUNCTION streamd.queue_extend(p_queue text, p_offsets bigint[], p_tokens uuid[], p_vt_ms bigint, p_now timestamptz)
RETURNS TABLE ("offset" bigint, lease_token uuid, visibility_timeout timestamptz)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := coalesce(p_now, clock_timestamp());
    v_q      streamd.queues;
    v_groups text[];
    v_tens   text[];
    v_offs   bigint[];
    v_ids    text[];
BEGIN
    v_q := streamd.queue_get(p_queue);
    PERFORM streamd.queue_check_offsets(p_queue, p_offsets);
    IF p_vt_ms IS NULL OR p_vt_ms <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204',
            MESSAGE = format('queue %L: visibility timeout %s ms must be positive', p_queue, p_vt_ms);
    END IF;
    IF v_q.fifo THEN
        SELECT l.keys, l.tenants INTO v_groups, v_tens FROM streamd.queue_lock_groups(p_queue, p_offsets, p_tokens) l;
        v_now := coalesce(p_now, clock_timestamp()); -- after the group locks (the clock rule)
    END IF;
    -- A HOT update, like the lease it extends.
    RETURN QUERY
    UPDATE streamd.queue_messages m SET visibility_timeout = v_now + make_interval(secs => p_vt_ms / 1000.0)
    FROM unnest(p_offsets, p_tokens) r(o, t)
    WHERE m.stream_name = p_queue AND m."offset" = r.o AND m.lease_token = r.t
    RETURNING m."offset", r.t, m.visibility_timeout;
    IF v_q.fifo THEN
        PERFORM streamd.queue_groups_advance(p_queue, v_groups, v_tens, v_now);
    END IF;
END;
$$;

-- Terminates the messages named by (offset, token): each moves to its dead-letter queue
-- now with p_reasons (parallel) as its last error, or is deleted when it has none.
-- Returns the settled receipts and whether each was moved (false: discarded).
CREATE OR REPLACE FUNCTION streamd.queue_term(p_queue text, p_offsets bigint[], p_tokens uuid[], p_reasons text[], p_now timestamptz)
RETURNS TABLE ("offset" bigint, lease_token uuid, dead_lettered boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    v_q      streamd.queues;
    v_groups text[];
    v_tens   text[];
    v_offs   bigint[];
    v_toks   uuid[];
    v_errs   text[];
    v_moved  bool[];
BEGIN
    v_q := streamd.queue_get(p_queue);
    PERFORM streamd.queue_check_offsets(p_queue, p_offsets);
    IF v_q.fifo THEN
        SELECT l.keys, l.tenants INTO v_groups, v_tens FROM streamd.queue_lock_groups(p_queue, p_offsets, p_tokens) l;
    END IF;
    SELECT array_agg(c.o), array_agg(c.t), array_agg(c.e), array_agg(c.moved) INTO v_offs, v_toks, v_errs, v_moved
    FROM (SELECT m."offset" AS o, r.t, r.e, streamd.queue_dlq_ok(coalesce(m.dead_letter_stream, v_q.dead_letter_queue)) AS moved
          FROM streamd.queue_messages m
          JOIN (SELECT DISTINCT ON (u.o, u.t) u.o, u.t, u.e
                FROM unnest(p_offsets, p_tokens, p_reasons) WITH ORDINALITY u(o, t, e, i)
                ORDER BY u.o, u.t, u.i) r ON m."offset" = r.o AND m.lease_token = r.t
          WHERE m.stream_name = p_queue
          ORDER BY m."offset"
          FOR UPDATE OF m) c;
    IF v_offs IS NOT NULL THEN
        PERFORM streamd.queue_dead_letter(p_queue, v_offs, v_errs, true, p_now);
    END IF;
    IF v_q.fifo THEN
        PERFORM streamd.queue_groups_advance(p_queue, v_groups, v_tens, p_now);
    END IF;
    RETURN QUERY SELECT x.o, x.t, x.mv FROM unnest(v_offs, v_toks, v_moved) x(o, t, mv);
END;
$$;

-- Moves up to p_limit dead letters of p_dlq (those not in flight and whose origin queue
-- exists) back to their origin queues, in dead-letter order, with fresh attempts and
-- the origin's settings. Returns how many moved.
CREATE OR REPLACE FUNCTION streamd.queue_redrive(p_dlq text, p_limit integer, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    v_offs  bigint[];
BEGIN
    PERFORM streamd.queue_get(p_dlq);
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD204', MESSAGE = format('queue %L: redrive limit %s must be positive', p_dlq, p_limit);
    END IF;
    SELECT array_agg(c.o) INTO v_offs
    FROM (SELECT m."offset" AS o FROM streamd.queue_messages m
          WHERE m.stream_name = p_dlq AND m.origin_stream IS NOT NULL
            AND NOT (m.lease_token IS NOT NULL AND m.visibility_timeout > v_now)
            AND EXISTS (SELECT 1 FROM streamd.queues oq WHERE oq.queue_name = m.origin_stream)
          ORDER BY m."offset" LIMIT p_limit
          FOR UPDATE OF m SKIP LOCKED) c;
    IF v_offs IS NULL THEN
        RETURN 0;
    END IF;
    RETURN streamd.queue_redrive_offsets(p_dlq, v_offs, v_now);
END;
$$;

-- Moves dead letters p_offs of p_dlq, locked by the caller or not in flight, whose
-- origin queue exists, back to their origin queues (queue_redrive, and the targeted
-- replay of queue_dead_letters_settle). Their records (queue_dead_letters) are marked
-- replayed. Returns how many moved.
CREATE OR REPLACE FUNCTION streamd.queue_redrive_offsets(p_dlq text, p_offs bigint[], p_now timestamptz) RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    v_offs  bigint[];
    v_ids   text[];
    v_n     integer;
    v_force boolean := false;
BEGIN
    SELECT array_agg(c.o) INTO v_offs
    FROM (SELECT m."offset" AS o FROM streamd.queue_messages m
          WHERE m.stream_name = p_dlq AND m."offset" = ANY(p_offs) AND m.origin_stream IS NOT NULL
            AND NOT (m.lease_token IS NOT NULL AND m.visibility_timeout > v_now)
          ORDER BY m."offset"
          FOR UPDATE OF m) c;
    IF v_offs IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM streamd.queue_lock_shared(ARRAY(SELECT DISTINCT m.origin_stream FROM streamd.queue_messages m
                                            WHERE m.stream_name = p_dlq AND m."offset" = ANY(v_offs)));
    -- FIFO origins: lock (or create) the groups first, as a send does (WHERE false:
    -- an existing group is locked, not rewritten); a message goes back to its own
    -- tenant's group.
    INSERT INTO streamd.message_groups AS g (stream_name, group_key, tenant_id, visible_at)
    SELECT DISTINCT m.origin_stream, coalesce(m.group_key, ''), coalesce(m.tenant_id, ''), v_now
    FROM streamd.queue_messages m JOIN streamd.queues oq ON oq.queue_name = m.origin_stream AND oq.fifo
    WHERE m.stream_name = p_dlq AND m."offset" = ANY(v_offs)
    ORDER BY 1, 2, 3
    ON CONFLICT (stream_name, group_key, tenant_id) DO UPDATE SET visible_at = g.visible_at WHERE false;

    -- Only rows whose origin exists in this statement's snapshot: the insert below
    -- joins the same snapshot's queues, so a row is deleted only when it is inserted.
    -- As in queue_dead_letter: an uncommitted send of the same id makes the insert
    -- fail once the send commits; the move is then made again with named ids suffixed.
    LOOP
    BEGIN
    WITH d AS (
        DELETE FROM streamd.queue_messages m WHERE m.stream_name = p_dlq AND m."offset" = ANY(v_offs)
          AND EXISTS (SELECT 1 FROM streamd.queues oq WHERE oq.queue_name = m.origin_stream)
        RETURNING m.*
    ), ins AS (
        INSERT INTO streamd.queue_messages (stream_name, "offset", message_id, data, metadata, enqueued_at, visibility_timeout,
                                            group_key, last_error, dedup, tenant_id, data_bytes)
        SELECT d.origin_stream, nextval(oq.offset_seq),
               CASE WHEN d.dedup AND (v_force OR EXISTS (SELECT 1 FROM streamd.queue_messages x
                                             WHERE x.message_id = d.message_id AND x.stream_name = d.origin_stream
                                               AND x.dedup))
                    THEN d.message_id || '~' || p_dlq || ':' || d."offset" ELSE d.message_id END,
               d.data, d.metadata, d.enqueued_at, v_now,
               CASE WHEN oq.fifo THEN coalesce(d.group_key, '') END, d.last_error, d.dedup, d.tenant_id, d.data_bytes
        FROM d JOIN streamd.queues oq ON oq.queue_name = d.origin_stream
        ORDER BY d."offset"
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM ins), (SELECT coalesce(array_agg(d.message_id), '{}') FROM d) INTO v_n, v_ids;
    PERFORM streamd.queue_dead_letters_mark(p_dlq, v_ids, 'replayed', NULL, v_now);
    RETURN v_n;
    EXCEPTION WHEN unique_violation THEN
        IF v_force THEN
            RAISE;
        END IF;
        v_force := true;
    END;
    END LOOP;
END;
$$;

-- Deletes every message of a queue (and its FIFO groups); returns how many. A tenant
-- role deletes only its tenant's messages and groups (row-level security).
CREATE OR REPLACE FUNCTION streamd.queue_purge(p_queue text) RETURNS bigint
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
DECLARE
    v_n bigint;
BEGIN
    PERFORM streamd.queue_get(p_queue);
    DELETE FROM streamd.message_groups g WHERE g.stream_name = p_queue;
    DELETE FROM streamd.queue_messages m WHERE m.stream_name = p_queue;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

-- Deletes the given messages of a queue that are not in flight (e.g. discarding dead
-- letters); returns the offsets deleted.
CREATE OR REPLACE FUNCTION streamd.queue_discard(p_queue text, p_offsets bigint[], p_now timestamptz)
RETURNS SETOF bigint
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
DECLARE
    v_now    timestamptz := coalesce(p_now, clock_timestamp());
    v_q      streamd.queues;
    v_groups text[];
    v_tens   text[];
    v_offs   bigint[];
    v_ids    text[];
BEGIN
    v_q := streamd.queue_get(p_queue);
    IF v_q.fifo THEN
        -- A locking probe of the primary key per group, in key order, as in
        -- queue_lock_groups (a join scanned the queue's groups).
        SELECT coalesce(array_agg(l.group_key ORDER BY l.group_key, l.tenant_id), '{}'),
               coalesce(array_agg(l.tenant_id ORDER BY l.group_key, l.tenant_id), '{}')
        INTO v_groups, v_tens
        FROM (SELECT DISTINCT m.group_key AS key, coalesce(m.tenant_id, '') AS ten FROM streamd.queue_messages m
              WHERE m.stream_name = p_queue AND m."offset" = ANY(p_offsets)
              ORDER BY 1, 2) k
        CROSS JOIN LATERAL (SELECT g.group_key, g.tenant_id FROM streamd.message_groups g
                            WHERE g.stream_name = p_queue AND g.group_key = k.key AND g.tenant_id = k.ten
                            FOR UPDATE) l;
        v_now := coalesce(p_now, clock_timestamp()); -- after the group locks (the clock rule)
    END IF;
    WITH del AS (
        DELETE FROM streamd.queue_messages m
        WHERE m.stream_name = p_queue AND m."offset" = ANY(p_offsets)
          AND NOT (m.lease_token IS NOT NULL AND m.visibility_timeout > v_now)
        RETURNING m."offset", m.message_id
    )
    SELECT coalesce(array_agg(del."offset"), '{}'), coalesce(array_agg(del.message_id), '{}') INTO v_offs, v_ids FROM del;
    -- The records of the dead letters deleted (queue_dead_letters) are marked discarded.
    PERFORM streamd.queue_dead_letters_mark(p_queue, v_ids, 'discarded', NULL, v_now);
    RETURN QUERY SELECT u.o FROM unnest(v_offs) u(o);
    IF v_q.fifo THEN
        PERFORM streamd.queue_groups_advance(p_queue, v_groups, v_tens, v_now);
    END IF;
END;
$$;

-- Per-queue statistics at p_now (NULL: statement_timestamp()); p_queue NULL means every queue.
--   depth          messages visible now (ready to deliver)
--   in_flight      received, lease not yet expired
--   delayed        waiting for a send delay or a nack delay
--   total          all messages of the queue
--   dead_lettered  messages that came from this queue and sit in a dead-letter queue
--   oldest_enqueued_at  the enqueue time of the queue's oldest message
-- Each queue is read through the primary key: migration 0008 tells the planner that a
-- queue is the whole table (n_distinct = 1), so left to itself it scanned the whole
-- table once per queue (62 s for 1,014 queues and 278k messages, which stalled the
-- leader's gauges).
CREATE OR REPLACE FUNCTION streamd.queue_stats(p_queue text, p_now timestamptz)
RETURNS TABLE (queue_name text, fifo boolean, dead_letter_queue text, depth bigint, in_flight bigint,
               delayed bigint, total bigint, dead_lettered bigint, oldest_enqueued_at timestamptz)
LANGUAGE sql STABLE SET enable_seqscan = off AS $$
    SELECT q.queue_name, q.fifo, q.dead_letter_queue,
           coalesce(s.depth, 0), coalesce(s.in_flight, 0), coalesce(s.delayed, 0), coalesce(s.total, 0),
           (SELECT count(*) FROM streamd.queue_messages d WHERE d.origin_stream = q.queue_name),
           s.oldest
    FROM (SELECT coalesce(p_now, statement_timestamp()) AS ts) t
    CROSS JOIN streamd.queues q
    LEFT JOIN LATERAL (
        SELECT count(*) FILTER (WHERE m.visibility_timeout <= t.ts) AS depth,
               count(*) FILTER (WHERE m.visibility_timeout > t.ts AND m.lease_token IS NOT NULL) AS in_flight,
               count(*) FILTER (WHERE m.visibility_timeout > t.ts AND m.lease_token IS NULL) AS delayed,
               count(*) AS total,
               min(m.enqueued_at) AS oldest
        FROM streamd.queue_messages m WHERE m.stream_name = q.queue_name) s ON true
    WHERE p_queue IS NULL OR q.queue_name = p_queue
    ORDER BY q.queue_name
$$;
