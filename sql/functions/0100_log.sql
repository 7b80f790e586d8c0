-- Functions of the persistent log. Applied idempotently on every migrate.
--
-- Errors raised here use SQLSTATE class SD (streamd); the Go side maps each code to a
-- sentinel in one place (streams/errors.go):
--   SD001 stream not found       SD002 partition not found   SD003 invalid name
--   SD004 payload too large      SD005 invalid argument      SD006 partitions decrease
--   SD007 offset out of range

-- A stream name: 1 to 249 characters of [A-Za-z0-9._-], not "." or ".." (Kafka's rule).
CREATE OR REPLACE FUNCTION streamd.valid_stream_name(p_name text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_name IS NOT NULL AND p_name ~ '^[A-Za-z0-9._-]{1,249}$' AND p_name NOT IN ('.', '..')
$$;

-- The partition of a key: the first four bytes of SHA-256 of its UTF-8 bytes, as a
-- big-endian unsigned integer, modulo the partition count. The Go producer computes the
-- same (streams.PartitionForKey), so a key lands on one partition by either path.
CREATE OR REPLACE FUNCTION streamd.partition_for_key(p_key text, p_partitions integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT (((get_byte(h, 0)::bigint << 24) | (get_byte(h, 1) << 16) | (get_byte(h, 2) << 8) | get_byte(h, 3))
            % p_partitions)::integer
    FROM (SELECT sha256(convert_to(p_key, 'UTF8')) AS h) s
$$;

-- Creates a stream with p_partitions partitions, or grows an existing one to that many.
-- Asking for fewer partitions than the stream has is refused (SD006): offsets, keys and
-- group offsets live on partitions.
CREATE OR REPLACE FUNCTION streamd.create_stream(p_stream_name text, p_partitions integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_current integer;
BEGIN
    IF NOT streamd.valid_stream_name(p_stream_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD003',
            MESSAGE = format('invalid stream name %L: use 1 to 249 characters of A-Z a-z 0-9 . _ -', p_stream_name);
    END IF;
    IF p_partitions IS NULL OR p_partitions < 1 OR p_partitions > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('invalid partition count %s for stream %L: must be between 1 and 10000', p_partitions, p_stream_name);
    END IF;

    INSERT INTO streamd.streams (stream_name, partitions) VALUES (p_stream_name, p_partitions)
    ON CONFLICT (stream_name) DO NOTHING;
    SELECT partitions INTO v_current FROM streamd.streams WHERE stream_name = p_stream_name FOR UPDATE;

    IF p_partitions < v_current THEN
        RAISE EXCEPTION USING ERRCODE = 'SD006',
            MESSAGE = format('stream %L has %s partitions; the count cannot decrease to %s', p_stream_name, v_current, p_partitions);
    END IF;
    IF p_partitions > v_current THEN
        UPDATE streamd.streams SET partitions = p_partitions, updated_at = now() WHERE stream_name = p_stream_name;
    END IF;
    INSERT INTO streamd.stream_partitions (stream_name, partition)
    SELECT p_stream_name, g FROM generate_series(0, p_partitions - 1) g
    ON CONFLICT DO NOTHING;
END;
$$;

-- Deletes a stream, its partitions and all its events. Returns false when it did not exist.
CREATE OR REPLACE FUNCTION streamd.delete_stream(p_stream_name text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    -- Lock the stream first so that concurrent appends fail cleanly with SD001 after us.
    PERFORM 1 FROM streamd.streams WHERE stream_name = p_stream_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM streamd.stream_partitions WHERE stream_name = p_stream_name ORDER BY partition FOR UPDATE;
    DELETE FROM streamd.events WHERE stream_name = p_stream_name;
    DELETE FROM streamd.streams WHERE stream_name = p_stream_name;
    RETURN true;
END;
$$;

-- Raises SD005 unless every given array length (NULL: an array not given) is p_n:
-- the parallel arrays of an append describe one event per index.
CREATE OR REPLACE FUNCTION streamd.append_check_lengths(p_n integer, VARIADIC p_lengths integer[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_lengths) AS l(n) WHERE l.n IS NOT NULL AND l.n <> p_n) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = 'append: the arrays must all have the same length';
    END IF;
END;
$$;

-- Routes a batch and checks it before anything is written: a NULL partition becomes
-- the key's partition (partition_for_key) or, for a keyless event, one partition per
-- transaction; a NULL event_id becomes a UUID. Raises SD002 for a partition the stream
-- does not have, SD004 for a payload over the stream's limit, SD005 for an event with
-- both payload kinds. Shared by streamd.append and streamd.append_versioned.
CREATE OR REPLACE FUNCTION streamd.append_route(
    p_stream      streamd.streams,
    p_n           integer,
    p_partitions  integer[],
    p_keys        text[],
    p_event_ids   text[],
    p_data        text[],
    p_data_bytes  bytea[],
    OUT parts     integer[],
    OUT ids       text[])
LANGUAGE plpgsql AS $$
DECLARE
    v_sticky integer := (pg_current_xact_id()::text::bigint % p_stream.partitions)::integer;
    v_bad    integer;
BEGIN
    SELECT array_agg(coalesce(u.p, CASE WHEN u.k IS NOT NULL THEN streamd.partition_for_key(u.k, p_stream.partitions) ELSE v_sticky END) ORDER BY u.i),
           array_agg(coalesce(u.e, streamd.new_event_id()) ORDER BY u.i)
      INTO parts, ids
      FROM unnest(coalesce(p_partitions, array_fill(NULL::integer, ARRAY[p_n])),
                  coalesce(p_keys, array_fill(NULL::text, ARRAY[p_n])),
                  coalesce(p_event_ids, array_fill(NULL::text, ARRAY[p_n])))
           WITH ORDINALITY AS u(p, k, e, i);

    SELECT min(u.i) INTO v_bad FROM unnest(parts) WITH ORDINALITY AS u(p, i)
     WHERE u.p < 0 OR u.p >= p_stream.partitions;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD002',
            MESSAGE = format('stream %L has no partition %s (it has %s)', p_stream.stream_name, parts[v_bad], p_stream.partitions);
    END IF;
    SELECT min(u.i) INTO v_bad
      FROM unnest(coalesce(p_data, array_fill(NULL::text, ARRAY[p_n])),
                  coalesce(p_data_bytes, array_fill(NULL::bytea, ARRAY[p_n]))) WITH ORDINALITY AS u(d, b, i)
     WHERE coalesce(octet_length(u.d), 0) + coalesce(octet_length(u.b), 0) > p_stream.max_payload_bytes
        OR (u.d IS NOT NULL AND u.b IS NOT NULL);
    IF v_bad IS NOT NULL THEN
        IF p_data[v_bad] IS NOT NULL AND p_data_bytes[v_bad] IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'SD005',
                MESSAGE = format('event %s has both a JSON and a binary payload; give one', v_bad);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'SD004',
            MESSAGE = format('event %s: payload of %s bytes exceeds the limit of %s bytes of stream %L', v_bad,
                             coalesce(octet_length(p_data[v_bad]), octet_length(p_data_bytes[v_bad])), p_stream.max_payload_bytes, p_stream.stream_name);
    END IF;
END;
$$;

-- Appends a batch of events to one stream, atomically, and returns each one's position.
-- This is the Go producer's path and the fast path for SQL callers. The arrays are
-- parallel (element i of each describes event i); any array may be NULL, meaning all
-- its elements are NULL. A NULL partition routes by key (partition_for_key), or, for a
-- keyless event, to one partition chosen per call. A NULL event_id gets a UUID.
--
-- An event whose event_id the stream already holds is not stored again: its row says
-- duplicate = true with the original position (L4). Offsets stay gapless either way.
-- Event ids are unique per stream across tenants: a tenant role whose event id is held
-- by an event it cannot see (another tenant's, or one without a tenant) gets SD005 and
-- nothing of the batch is stored (docs/tenants.md).
--
-- Head rows are locked in ascending partition order, so concurrent batches never
-- deadlock on them; they stay locked until the calling transaction ends (L1).
CREATE OR REPLACE FUNCTION streamd.append(
    p_stream_name     text,
    p_partitions      integer[],
    p_event_ids       text[],
    p_event_types     text[],
    p_keys            text[],
    p_data            text[],
    p_data_bytes      bytea[],
    p_metadata        text[],
    p_correlation_ids text[],
    p_causation_ids   text[],
    p_versions        integer[]
) RETURNS TABLE (ord integer, partition integer, "offset" bigint, "timestamp" timestamptz, duplicate boolean)
LANGUAGE plpgsql AS $$
DECLARE
    -- The longest array is the batch (any may be NULL, e.g. tombstones given only
    -- partitions and types); append_check_lengths refuses arrays of other lengths.
    v_n        integer := coalesce(greatest(cardinality(p_partitions), cardinality(p_event_ids), cardinality(p_event_types),
                                            cardinality(p_keys), cardinality(p_data), cardinality(p_data_bytes),
                                            cardinality(p_metadata), cardinality(p_correlation_ids),
                                            cardinality(p_causation_ids), cardinality(p_versions)), 0);
    v_stream   streamd.streams%ROWTYPE;
    v_parts    integer[];
    v_ids      text[];
    v_offs     bigint[];
    v_tss      timestamptz[];
    v_bp       integer[] := '{}';
    v_bo       bigint[] := '{}';
    v_bt       timestamptz[] := '{}';
    v_bc       bigint[] := '{}';
    v_next     bigint;
    v_off      bigint;
    v_base     bigint;
    v_ts       timestamptz;
    v_inserted integer;
    r          record;
BEGIN
    SELECT * INTO v_stream FROM streamd.streams s WHERE s.stream_name = p_stream_name;
    IF NOT FOUND THEN
        IF NOT streamd.valid_stream_name(p_stream_name) THEN
            RAISE EXCEPTION USING ERRCODE = 'SD003', MESSAGE = format('invalid stream name %L', p_stream_name);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'SD001', MESSAGE = format('stream %L does not exist', p_stream_name);
    END IF;
    IF v_stream.read_only THEN
        PERFORM streamd.raise_read_only(p_stream_name);
    END IF;
    -- A stream that keeps per-key versions or enforces event types takes the event
    -- sourcing path (sql/functions/1000_eventstore.sql); every other stream pays only
    -- this test of two columns of the row read above.
    IF v_stream.key_versions OR v_stream.enforce_event_types THEN
        RETURN QUERY SELECT a.ord, a.partition, a."offset", a."timestamp", a.duplicate
          FROM streamd.append_versioned(p_stream_name, p_partitions, p_event_ids, p_event_types, p_keys, p_data,
                                        p_data_bytes, p_metadata, p_correlation_ids, p_causation_ids, p_versions,
                                        NULL, NULL, NULL) a;
        RETURN;
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    PERFORM streamd.append_check_lengths(v_n, cardinality(p_partitions), cardinality(p_event_ids),
        cardinality(p_event_types), cardinality(p_keys), cardinality(p_data), cardinality(p_data_bytes),
        cardinality(p_metadata), cardinality(p_correlation_ids), cardinality(p_causation_ids), cardinality(p_versions));

    SELECT rt.parts, rt.ids INTO v_parts, v_ids
      FROM streamd.append_route(v_stream, v_n, p_partitions, p_keys, p_event_ids, p_data, p_data_bytes) rt;

    -- Reserve offsets: one head-row update per partition, in ascending partition order
    -- (streamd.head_reserve: the caller needs no write privilege on the head rows).
    FOR r IN SELECT u.p, count(*) AS cnt FROM unnest(v_parts) AS u(p) GROUP BY u.p ORDER BY u.p LOOP
        SELECT hr.base, hr.ts INTO v_base, v_ts FROM streamd.head_reserve(p_stream_name, r.p, r.cnt::integer) hr;
        IF v_base IS NULL THEN -- the stream was deleted while this waited: SD001
            PERFORM streamd.raise_partition_missing(p_stream_name, r.p);
        END IF;
        v_bp := v_bp || r.p;
        v_bo := v_bo || v_base;
        v_bt := v_bt || v_ts;
        v_bc := v_bc || r.cnt;
    END LOOP;
    PERFORM streamd.append_recheck_rules(p_stream_name, v_stream.key_versions, v_stream.enforce_event_types);

    SELECT array_agg(b.base + x.rn - 1 ORDER BY x.i), array_agg(b.ts ORDER BY x.i)
      INTO v_offs, v_tss
      FROM (SELECT u.i, u.p, row_number() OVER (PARTITION BY u.p ORDER BY u.i) AS rn
              FROM unnest(v_parts) WITH ORDINALITY AS u(p, i)) x
      JOIN unnest(v_bp, v_bo, v_bt) AS b(p, base, ts) ON b.p = x.p;

    PERFORM set_config('streamd.append_trusted', 'on', true);
    WITH ins AS (
        INSERT INTO streamd.events AS e (stream_name, partition, "offset", event_id, event_type, key, data, data_bytes,
                                         metadata, "timestamp", correlation_id, causation_id, version)
        SELECT p_stream_name, u.p, u.o, u.e, coalesce(u.t, ''), u.k, u.d::jsonb, u.b, u.m::jsonb, u.ts, u.c, u.ca, coalesce(u.v, 1)
          FROM unnest(v_parts, v_offs, v_ids,
                      coalesce(p_event_types, array_fill(NULL::text, ARRAY[v_n])),
                      coalesce(p_keys, array_fill(NULL::text, ARRAY[v_n])),
                      coalesce(p_data, array_fill(NULL::text, ARRAY[v_n])),
                      coalesce(p_data_bytes, array_fill(NULL::bytea, ARRAY[v_n])),
                      coalesce(p_metadata, array_fill(NULL::text, ARRAY[v_n])),
                      v_tss,
                      coalesce(p_correlation_ids, array_fill(NULL::text, ARRAY[v_n])),
                      coalesce(p_causation_ids, array_fill(NULL::text, ARRAY[v_n])),
                      coalesce(p_versions, array_fill(NULL::integer, ARRAY[v_n])))
               AS u(p, o, e, t, k, d, b, m, ts, c, ca, v)
         ORDER BY u.p, u.o
        ON CONFLICT (stream_name, event_id) DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO v_inserted FROM ins;

    IF v_inserted = v_n THEN
        PERFORM set_config('streamd.append_trusted', 'off', true);
        RETURN QUERY SELECT u.i::integer, u.p, u.o, u.ts, false FROM unnest(v_parts, v_offs, v_tss) WITH ORDINALITY AS u(p, o, ts, i);
        RETURN;
    END IF;

    -- A tenant role cannot see another tenant's events (nor those without a tenant),
    -- but the unique index holds every tenant's event ids: an id held by such an event
    -- stored nothing and had no position to report (the event was lost, and the
    -- producer failed with an untyped count mismatch after the rest committed). It is
    -- refused instead (the check the other append paths make first); the error undoes
    -- the whole batch.
    PERFORM streamd.refuse_hidden_event_ids(p_stream_name, v_ids);

    -- Rare path: some event_ids were already stored (a retry). Close the holes their
    -- reserved offsets left by moving our own rows (not yet visible to anyone) down in
    -- offset order, and give back the offsets that were not used.
    FOR r IN SELECT b.p, b.base, b.cnt FROM unnest(v_bp, v_bo, v_bc) AS b(p, base, cnt) LOOP
        v_next := r.base;
        FOR v_off IN SELECT e."offset" FROM streamd.events e
                      WHERE e.stream_name = p_stream_name AND e.partition = r.p
                        AND e."offset" >= r.base AND e."offset" < r.base + r.cnt
                      ORDER BY e."offset" LOOP
            IF v_off <> v_next THEN
                UPDATE streamd.events e SET "offset" = v_next
                 WHERE e.stream_name = p_stream_name AND e.partition = r.p AND e."offset" = v_off;
            END IF;
            v_next := v_next + 1;
        END LOOP;
        IF v_next < r.base + r.cnt THEN
            PERFORM streamd.head_give_back(p_stream_name, r.p, v_next);
        END IF;
    END LOOP;
    PERFORM set_config('streamd.append_trusted', 'off', true);

    -- An event is new when its stored row lies in the range reserved above for its
    -- partition and it is the first of its event_id in this batch.
    RETURN QUERY
        SELECT x.i::integer, e.partition, e."offset", e."timestamp",
               NOT (x.first_of_id AND e.partition = x.p AND e."offset" >= b.base)
          FROM (SELECT u.e, u.p, u.i, row_number() OVER (PARTITION BY u.e ORDER BY u.p, u.i) = 1 AS first_of_id
                  FROM unnest(v_ids, v_parts) WITH ORDINALITY AS u(e, p, i)) x
          JOIN unnest(v_bp, v_bo) AS b(p, base) ON b.p = x.p
          JOIN streamd.events e ON e.stream_name = p_stream_name AND e.event_id = x.e
         ORDER BY x.i;
END;
$$;

-- The first offset of a partition whose timestamp is at or after p_time, or the log end
-- (next_offset) when there is none. Timestamps are monotonic per partition (the
-- appending transaction stamps them under the head-row lock), so this is a binary
-- search of primary-key probes, robust to holes left by retention or compaction.
CREATE OR REPLACE FUNCTION streamd.offset_for_time(p_stream_name text, p_partition integer, p_time timestamptz)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_lo  bigint;
    v_hi  bigint;
    v_mid bigint;
    v_off bigint;
    v_ts  timestamptz;
BEGIN
    SELECT h.log_start_offset, h.next_offset INTO v_lo, v_hi
      FROM streamd.stream_partitions h WHERE h.stream_name = p_stream_name AND h.partition = p_partition;
    IF NOT FOUND THEN
        PERFORM streamd.raise_partition_missing(p_stream_name, p_partition);
    END IF;
    -- Invariant: the answer is the first event at or after some x in [v_lo, v_hi].
    WHILE v_lo < v_hi LOOP
        v_mid := v_lo + (v_hi - v_lo) / 2;
        SELECT e."offset", e."timestamp" INTO v_off, v_ts
          FROM streamd.events e
         WHERE e.stream_name = p_stream_name AND e.partition = p_partition AND e."offset" >= v_mid
         ORDER BY e."offset" LIMIT 1;
        IF NOT FOUND OR v_ts >= p_time THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_off + 1;
        END IF;
    END LOOP;
    SELECT e."offset" INTO v_off
      FROM streamd.events e
     WHERE e.stream_name = p_stream_name AND e.partition = p_partition AND e."offset" >= v_lo
     ORDER BY e."offset" LIMIT 1;
    IF NOT FOUND THEN
        SELECT h.next_offset INTO v_off FROM streamd.stream_partitions h
         WHERE h.stream_name = p_stream_name AND h.partition = p_partition;
    END IF;
    RETURN v_off;
END;
$$;

-- Raises serialization_failure (40001, which clients retry) when the stream's event
-- sourcing settings are no longer the ones an append read before it waited for the
-- head rows: streamd.set_stream_event_sourcing holds those rows while it changes them,
-- and an append that read the old settings would otherwise go on under the old rules
-- (keyed events without versions, unregistered types). One primary-key read per
-- append, after its head rows are locked.
CREATE OR REPLACE FUNCTION streamd.append_recheck_rules(p_stream_name text, p_key_versions boolean, p_enforce_event_types boolean)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM streamd.streams s WHERE s.stream_name = p_stream_name
                 AND (s.key_versions, s.enforce_event_types) IS DISTINCT FROM (p_key_versions, p_enforce_event_types)) THEN
        RAISE EXCEPTION USING ERRCODE = '40001',
            MESSAGE = format('stream %L changed its event sourcing settings while this append waited: retry it', p_stream_name);
    END IF;
END;
$$;

-- Raises SD001 or SD002 (or SD003 for an invalid name) for a partition that is not there.
CREATE OR REPLACE FUNCTION streamd.raise_partition_missing(p_stream_name text, p_partition integer) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_partitions integer;
BEGIN
    IF NOT streamd.valid_stream_name(p_stream_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD003', MESSAGE = format('invalid stream name %L', p_stream_name);
    END IF;
    SELECT s.partitions INTO v_partitions FROM streamd.streams s WHERE s.stream_name = p_stream_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SD001', MESSAGE = format('stream %L does not exist', p_stream_name);
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'SD002',
        MESSAGE = format('stream %L has no partition %s (it has %s)', p_stream_name, p_partition, v_partitions);
END;
$$;

-- The fast path of the Go producer for a batch of p_count events to one partition, in
-- a transaction of its own that ends right after: reserves the offsets on the
-- partition's head row (L1: the lock is held until that transaction commits), marks the
-- transaction's rows as trusted, and returns the first offset and the timestamp for the
-- batch, which the producer then writes with COPY. Returns no row, reserving nothing,
-- when the batch must take streamd.append() instead: a stream with per-key versions or
-- enforced event types, or a payload (p_max_payload_bytes, the largest of the batch)
-- over the stream's limit. COPY has no ON CONFLICT: a duplicate event id fails the COPY
-- (unique violation) and the producer retries the batch through streamd.append().
--
-- Not for use in a transaction that goes on after the COPY: the trusted mark stays set
-- until the transaction ends.
CREATE OR REPLACE FUNCTION streamd.append_reserve(p_stream_name text, p_partition integer, p_count integer,
                                                  p_max_payload_bytes integer)
RETURNS TABLE (base bigint, ts timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_stream streamd.streams%ROWTYPE;
BEGIN
    SELECT * INTO v_stream FROM streamd.streams s WHERE s.stream_name = p_stream_name;
    IF NOT FOUND OR p_partition < 0 OR p_partition >= v_stream.partitions THEN
        PERFORM streamd.raise_partition_missing(p_stream_name, p_partition);
    END IF;
    IF p_count < 1 OR v_stream.key_versions OR v_stream.enforce_event_types OR v_stream.read_only
       OR p_max_payload_bytes IS NULL OR p_max_payload_bytes > v_stream.max_payload_bytes THEN
        RETURN;
    END IF;
    SELECT hr.base, hr.ts INTO base, ts FROM streamd.head_reserve(p_stream_name, p_partition, p_count) hr;
    IF base IS NULL THEN
        -- The stream was deleted while this waited for its head row: the same error
        -- as append() gives, not a row of NULLs.
        PERFORM streamd.raise_partition_missing(p_stream_name, p_partition);
    END IF;
    PERFORM streamd.append_recheck_rules(p_stream_name, v_stream.key_versions, v_stream.enforce_event_types);
    PERFORM set_config('streamd.append_trusted', 'on', true);
    RETURN NEXT;
END;
$$;

-- streamd.append_reserve for a one-statement append of SQL's own (the Go client's
-- one-statement path used it until session 12 and now sends a statement of its own,
-- streams/insert.go, with the same checks; this stays for SQL callers and for clients
-- of earlier versions), with the same
-- checks and effects, but a plain function rather than a set-returning one: called in
-- a target list, it returns its row without a tuplestore, and it calls head_reserve
-- and set_config as expressions, not as FROM items. Each tuplestore costs a separate
-- 16 KiB allocation; with the nine unnest()s the old statement took, they pushed every
-- one-record append over glibc's 128 KiB trim threshold, so each transaction grew the
-- heap with brk and gave it back at its end, with page faults and TLB flushes:
-- measured 2-3 times the server CPU of a plain INSERT's transaction (bench/RESULTS.md,
-- issue 21 §2). A declined batch (see append_reserve) returns base and ts NULL and
-- reserves nothing. Like append_reserve, not for use in a transaction that goes on
-- after its INSERT: the trusted mark stays set until the transaction ends (the
-- one-statement path runs in its own implicit transaction).
CREATE OR REPLACE FUNCTION streamd.append_reserve_row(p_stream_name text, p_partition integer, p_count integer,
                                                      p_max_payload_bytes integer, OUT base bigint, OUT ts timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_stream streamd.streams%ROWTYPE;
    v_head   record;
    v_set    text;
BEGIN
    SELECT * INTO v_stream FROM streamd.streams s WHERE s.stream_name = p_stream_name;
    IF NOT FOUND OR p_partition < 0 OR p_partition >= v_stream.partitions THEN
        PERFORM streamd.raise_partition_missing(p_stream_name, p_partition);
    END IF;
    IF p_count < 1 OR v_stream.key_versions OR v_stream.enforce_event_types OR v_stream.read_only
       OR p_max_payload_bytes IS NULL OR p_max_payload_bytes > v_stream.max_payload_bytes THEN
        RETURN;
    END IF;
    v_head := streamd.head_reserve(p_stream_name, p_partition, p_count);
    IF v_head.base IS NULL THEN
        -- The stream was deleted while this waited for its head row.
        PERFORM streamd.raise_partition_missing(p_stream_name, p_partition);
    END IF;
    PERFORM streamd.append_recheck_rules(p_stream_name, v_stream.key_versions, v_stream.enforce_event_types);
    v_set := set_config('streamd.append_trusted', 'on', true);
    base := v_head.base;
    ts := v_head.ts;
END;
$$;

-- Appends one event to partition p_partition of p_stream_name: what the Go client's
-- one-statement path called for a batch of one record until session 12 (it now sends
-- a statement of its own, streams/insert.go, with the same checks; this stays for SQL
-- callers and for clients of earlier versions), where the statement
-- around a reservation and an INSERT of arrays cost more than the event itself. The
-- same checks and effects as append_reserve_row followed by the INSERT, in one call
-- with scalar arguments: no arrays to receive and unnest, no CTE, and plans that
-- PL/pgSQL keeps for the session. Returns the event's offset and log time; both NULL,
-- with nothing written or reserved, when the append must take streamd.append()
-- instead (what append_reserve declines). A duplicate event id fails with a unique
-- violation (the caller retries through streamd.append(), which deduplicates, L4).
CREATE OR REPLACE FUNCTION streamd.append_one(p_stream_name text, p_partition integer, p_event_id text, p_event_type text,
                                              p_key text, p_data text, p_data_bytes bytea, p_metadata text,
                                              p_correlation_id text, p_causation_id text, p_version integer,
                                              OUT base bigint, OUT ts timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_stream streamd.streams%ROWTYPE;
    v_head   record;
    v_set    text;
BEGIN
    SELECT * INTO v_stream FROM streamd.streams s WHERE s.stream_name = p_stream_name;
    IF NOT FOUND OR p_partition < 0 OR p_partition >= v_stream.partitions THEN
        PERFORM streamd.raise_partition_missing(p_stream_name, p_partition);
    END IF;
    IF v_stream.key_versions OR v_stream.enforce_event_types OR v_stream.read_only
       OR coalesce(octet_length(p_data), 0) + coalesce(octet_length(p_data_bytes), 0) > v_stream.max_payload_bytes THEN
        RETURN;
    END IF;
    v_head := streamd.head_reserve(p_stream_name, p_partition, 1);
    IF v_head.base IS NULL THEN
        -- The stream was deleted while this waited for its head row.
        PERFORM streamd.raise_partition_missing(p_stream_name, p_partition);
    END IF;
    -- append_recheck_rules, inline.
    IF EXISTS (SELECT 1 FROM streamd.streams s WHERE s.stream_name = p_stream_name
                 AND (s.key_versions, s.enforce_event_types) IS DISTINCT FROM (v_stream.key_versions, v_stream.enforce_event_types)) THEN
        RAISE EXCEPTION USING ERRCODE = '40001',
            MESSAGE = format('stream %L changed its event sourcing settings while this append waited: retry it', p_stream_name);
    END IF;
    v_set := set_config('streamd.append_trusted', 'on', true);
    INSERT INTO streamd.events (stream_name, partition, "offset", event_id, event_type, key, data, data_bytes,
                                metadata, "timestamp", correlation_id, causation_id, version)
    VALUES (p_stream_name, p_partition, v_head.base, p_event_id, p_event_type, p_key, p_data::jsonb, p_data_bytes,
            p_metadata::jsonb, v_head.ts, p_correlation_id, p_causation_id, p_version);
    -- Off again, as append() leaves it: a caller's transaction that goes on (SQL's
    -- outbox use, L2) must not write or update events trusted afterwards.
    v_set := set_config('streamd.append_trusted', 'off', true);
    base := v_head.base;
    ts := v_head.ts;
END;
$$;
