-- Event sourcing on the log (issue 9). Applied idempotently on every migrate.
--
-- SQLSTATEs (mapped to sentinels in eventstore/errors.go):
--   SD401 version mismatch         SD402 key not open in this session
--   SD403 session expired          SD404 key held by another session
--   SD405 stream has no key versions   SD406 unknown event type
--
-- Session expiry is checked against coalesce(p_now, clock_timestamp()), not now():
-- now() is the start of the transaction, and a session must not look alive to a
-- transaction that began before it expired.

-- Appends a batch to a stream that keeps key versions or enforces event types (the
-- streams flags key_versions and enforce_event_types); streamd.append hands such
-- streams to this function, so the producer and SQL callers get the same rules. The
-- first eleven parameters are streamd.append's. Further:
--   p_expected_versions  element i: the version the key must have just before event i
--                        (0: no events yet), NULL: any. Needs a key.
--   p_session_id         the exclusive writer session every key of the batch must be
--                        held by (streamd.open_key_session); NULL: no session, and
--                        then no key of the batch may be held by a live session.
--   p_now                the time for session checks; NULL: clock_timestamp().
-- Returns streamd.append's columns plus each event's key_version (NULL without a key
-- or on a stream without key versions).
--
-- Order of locks: head rows in ascending partition order, then key heads in key order.
-- A retried event (its event_id already stored) is returned as a duplicate with its
-- original position and version and is not checked against p_expected_versions again,
-- so a retry of a successful append succeeds. On a stream with key versions, an
-- event_id stored under another key (or without one) is SD005, not a duplicate, and so
-- is, for a tenant role, an event_id held by an event it cannot see (another tenant's:
-- docs/tenants.md).
-- Repeating an event_id within one batch is refused (SD005). Two concurrent appends
-- of the same new event_id to different partitions (keyless events) make the second
-- fail with unique_violation (23505); its retry then finds the first and reports the
-- duplicate.
-- p_require_versions (the event store's appends): a stream that does not keep key
-- versions is SD405 even with no expected version and no session (streamd.append,
-- which sends streams that only enforce event types here, leaves it false).
CREATE OR REPLACE FUNCTION streamd.append_versioned(
    p_stream_name       text,
    p_partitions        integer[],
    p_event_ids         text[],
    p_event_types       text[],
    p_keys              text[],
    p_data              text[],
    p_data_bytes        bytea[],
    p_metadata          text[],
    p_correlation_ids   text[],
    p_causation_ids     text[],
    p_versions          integer[],
    p_expected_versions bigint[],
    p_session_id        text,
    p_now               timestamptz,
    p_require_versions  boolean DEFAULT false
) RETURNS TABLE (ord integer, partition integer, "offset" bigint, "timestamp" timestamptz, duplicate boolean, key_version bigint)
LANGUAGE plpgsql AS $$
DECLARE
    -- The longest array is the batch, as in streamd.append.
    v_n      integer := coalesce(greatest(cardinality(p_partitions), cardinality(p_event_ids), cardinality(p_event_types),
                                          cardinality(p_keys), cardinality(p_data), cardinality(p_data_bytes),
                                          cardinality(p_metadata), cardinality(p_correlation_ids),
                                          cardinality(p_causation_ids), cardinality(p_versions),
                                          cardinality(p_expected_versions)), 0);
    v_now    timestamptz := coalesce(p_now, clock_timestamp());
    v_stream streamd.streams%ROWTYPE;
    v_keys   text[];
    v_parts  integer[];
    v_ids    text[];
    v_dup    boolean[];
    v_kv     bigint[];
    v_offs   bigint[];
    v_tss    timestamptz[];
    v_bp     integer[] := '{}';
    v_bo     bigint[] := '{}';
    v_bt     timestamptz[] := '{}';
    v_base   bigint;
    v_ts     timestamptz;
    v_bad    integer;
    v_hk     text[];
    v_hl     bigint[];
    v_hc     bigint[];
    v_hs     text[];
    v_he     timestamptz[];
    r        record;
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
    IF NOT v_stream.key_versions
       AND (p_require_versions OR p_session_id IS NOT NULL
            OR EXISTS (SELECT 1 FROM unnest(p_expected_versions) AS x(v) WHERE x.v IS NOT NULL)) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD405',
            MESSAGE = format('stream %L does not keep key versions: expected versions and sessions need them (streamd.set_stream_event_sourcing)', p_stream_name);
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    PERFORM streamd.append_check_lengths(v_n, cardinality(p_partitions), cardinality(p_event_ids),
        cardinality(p_event_types), cardinality(p_keys), cardinality(p_data), cardinality(p_data_bytes),
        cardinality(p_metadata), cardinality(p_correlation_ids), cardinality(p_causation_ids), cardinality(p_versions),
        cardinality(p_expected_versions));
    v_keys := coalesce(p_keys, array_fill(NULL::text, ARRAY[v_n]));

    SELECT rt.parts, rt.ids INTO v_parts, v_ids
      FROM streamd.append_route(v_stream, v_n, p_partitions, v_keys, p_event_ids, p_data, p_data_bytes) rt;
    IF v_stream.key_versions THEN
        -- A key's versions are serialised by its partition's head row: keyed events
        -- go to their key's partition.
        SELECT min(u.i) INTO v_bad FROM unnest(v_parts, v_keys) WITH ORDINALITY AS u(p, k, i)
         WHERE u.k IS NOT NULL AND u.p <> streamd.partition_for_key(u.k, v_stream.partitions);
        IF v_bad IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'SD005',
                MESSAGE = format('event %s: stream %L keeps key versions, so key %L must go to its own partition %s, not %s',
                                 v_bad, p_stream_name, v_keys[v_bad], streamd.partition_for_key(v_keys[v_bad], v_stream.partitions), v_parts[v_bad]);
        END IF;
    END IF;
    SELECT min(u.i) INTO v_bad FROM unnest(p_expected_versions, v_keys) WITH ORDINALITY AS u(x, k, i)
     WHERE u.x IS NOT NULL AND (u.x < 0 OR u.k IS NULL);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('event %s: an expected version must be >= 0 and needs a key (got %s, key %L)', v_bad, p_expected_versions[v_bad], v_keys[v_bad]);
    END IF;
    IF p_session_id IS NOT NULL AND array_position(v_keys, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('event %s has no key: every event appended in a session needs the key the session holds', array_position(v_keys, NULL));
    END IF;
    SELECT min(x.i) INTO v_bad
      FROM (SELECT u.i, row_number() OVER (PARTITION BY u.e ORDER BY u.i) AS rn FROM unnest(v_ids) WITH ORDINALITY AS u(e, i)) x
     WHERE x.rn > 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('event %s repeats event_id %L of an earlier event of the batch', v_bad, v_ids[v_bad]);
    END IF;
    IF v_stream.enforce_event_types THEN
        SELECT min(u.i) INTO v_bad
          FROM unnest(coalesce(p_event_types, array_fill(''::text, ARRAY[v_n]))) WITH ORDINALITY AS u(t, i)
         WHERE NOT EXISTS (SELECT 1 FROM streamd.event_types et WHERE et.name = coalesce(u.t, ''));
        IF v_bad IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'SD406',
                MESSAGE = format('event %s: event type %L is not registered, and stream %L accepts registered types only',
                                 v_bad, coalesce(p_event_types[v_bad], ''), p_stream_name);
        END IF;
    END IF;

    -- Lock the head rows in ascending partition order; from here on, no other append
    -- to these partitions (and so to these keys) runs until we commit.
    PERFORM streamd.head_lock(p_stream_name, v_parts);

    -- Retries: events already stored keep their position. On a stream with key
    -- versions a stored event is a retry only if it is stored under the key asked for:
    -- an id stored under another key is another event (its position and version are
    -- the other key's), so the append is refused (SD005) rather than reported as done.
    SELECT array_agg(e.event_id IS NOT NULL ORDER BY u.i),
           min(u.i) FILTER (WHERE e.event_id IS NOT NULL AND e.key IS DISTINCT FROM v_keys[u.i])
      INTO v_dup, v_bad
      FROM unnest(v_ids) WITH ORDINALITY AS u(id, i)
      LEFT JOIN streamd.events e ON e.stream_name = p_stream_name AND e.event_id = u.id;
    IF v_bad IS NOT NULL AND v_stream.key_versions THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('event %s: event id %L of stream %L is stored under key %L, not %L',
                             v_bad, v_ids[v_bad], p_stream_name,
                             (SELECT e.key FROM streamd.events e WHERE e.stream_name = p_stream_name AND e.event_id = v_ids[v_bad]),
                             v_keys[v_bad]);
    END IF;
    -- A tenant role reads the events under row-level security: an id held by an event
    -- it cannot see looked new above, and would advance its key's head before the
    -- unique index refused it (23505). Refused here, as streamd.append refuses it,
    -- before anything moves. The owner (not under row-level security) skips the call.
    IF row_security_active('streamd.events'::regclass) THEN
        PERFORM streamd.refuse_hidden_event_ids(p_stream_name, v_ids);
    END IF;

    IF v_stream.key_versions THEN
        -- Advance each key's head by its number of new events, then check sessions
        -- and expected versions against the versions the heads had before: a failed
        -- check raises and undoes the advance with everything else. An append outside
        -- any session that finds an expired session on a key ends that session's hold
        -- in the same upsert: the session lost exclusive access, so it must not renew
        -- (streamd.renew_key_session) as if it had held the key throughout.
        WITH b AS (
            SELECT u.k, count(*) AS cnt FROM unnest(v_keys, v_dup) AS u(k, d)
             WHERE u.k IS NOT NULL AND NOT u.d GROUP BY u.k
        ), up AS (
            INSERT INTO streamd.key_heads AS h (stream_name, key, last_version, updated_at)
            SELECT p_stream_name, b.k, b.cnt, v_now FROM b ORDER BY b.k
            ON CONFLICT (stream_name, key) DO UPDATE
               SET last_version = h.last_version + excluded.last_version, updated_at = excluded.updated_at,
                   session_id = CASE WHEN p_session_id IS NULL AND h.session_expires_at <= v_now THEN NULL ELSE h.session_id END,
                   session_expires_at = CASE WHEN p_session_id IS NULL AND h.session_expires_at <= v_now THEN NULL ELSE h.session_expires_at END
            RETURNING h.key, h.last_version, h.session_id, h.session_expires_at
        )
        SELECT array_agg(up.key ORDER BY up.key), array_agg(up.last_version ORDER BY up.key), array_agg(b.cnt ORDER BY up.key),
               array_agg(up.session_id ORDER BY up.key), array_agg(up.session_expires_at ORDER BY up.key)
          INTO v_hk, v_hl, v_hc, v_hs, v_he
          FROM up JOIN b ON b.k = up.key;

        FOR r IN SELECT * FROM unnest(v_hk, v_hs, v_he) AS t(k, sid, exp) LOOP
            IF p_session_id IS NULL THEN
                IF r.sid IS NOT NULL AND r.exp > v_now THEN
                    RAISE EXCEPTION USING ERRCODE = 'SD404',
                        MESSAGE = format('key %L of stream %L is held by session %L until %s', r.k, p_stream_name, r.sid, r.exp);
                END IF;
            ELSIF r.sid = p_session_id THEN
                IF r.exp <= v_now THEN
                    RAISE EXCEPTION USING ERRCODE = 'SD403',
                        MESSAGE = format('session %L on key %L of stream %L expired at %s', p_session_id, r.k, p_stream_name, r.exp);
                END IF;
            ELSIF r.sid IS NOT NULL AND r.exp > v_now THEN
                RAISE EXCEPTION USING ERRCODE = 'SD404',
                    MESSAGE = format('key %L of stream %L is held by another session until %s', r.k, p_stream_name, r.exp);
            ELSE
                RAISE EXCEPTION USING ERRCODE = 'SD402',
                    MESSAGE = format('key %L of stream %L is not open in session %L', r.k, p_stream_name, p_session_id);
            END IF;
        END LOOP;

        -- Event i of key k gets (the key's head before) + (its rank among the key's new
        -- events); a duplicate keeps its stored version.
        SELECT array_agg(CASE WHEN x.k IS NULL OR x.d THEN NULL ELSE t.last - t.cnt + x.rn END ORDER BY x.i) INTO v_kv
          FROM (SELECT u.k, u.d, u.i, row_number() OVER (PARTITION BY u.k, u.d ORDER BY u.i) AS rn
                  FROM unnest(v_keys, v_dup) WITH ORDINALITY AS u(k, d, i)) x
          LEFT JOIN unnest(v_hk, v_hl, v_hc) AS t(k, last, cnt) ON t.k = x.k;

        SELECT min(u.i) INTO v_bad FROM unnest(v_kv, p_expected_versions, v_dup) WITH ORDINALITY AS u(v, x, d, i)
         WHERE u.x IS NOT NULL AND NOT u.d AND u.v - 1 <> u.x;
        IF v_bad IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'SD401',
                MESSAGE = format('version mismatch: key %L of stream %L is at version %s, the append expected %s',
                                 v_keys[v_bad], p_stream_name, v_kv[v_bad] - 1, p_expected_versions[v_bad]);
        END IF;
        -- A retry is all duplicates (appends are atomic). New events of a key whose
        -- expectation rode on an event already stored (by another append that shared
        -- its id) were never checked: that append moved the key, so this one's
        -- expectation no longer holds.
        SELECT min(u.i) INTO v_bad FROM unnest(v_keys, v_dup) WITH ORDINALITY AS u(k, d, i)
         WHERE u.k IS NOT NULL AND NOT u.d
           AND EXISTS (SELECT 1 FROM unnest(v_keys, v_dup, p_expected_versions) AS w(k, d, x)
                        WHERE w.k = u.k AND w.d AND w.x IS NOT NULL);
        IF v_bad IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'SD401',
                MESSAGE = format('version mismatch: key %L of stream %L: the append is partly stored already (an append with some of its event ids moved the key)',
                                 v_keys[v_bad], p_stream_name);
        END IF;
    END IF;

    -- Reserve offsets for the new events: one head-row update per partition.
    FOR r IN SELECT u.p, count(*) AS cnt FROM unnest(v_parts, v_dup) AS u(p, d) WHERE NOT u.d GROUP BY u.p ORDER BY u.p LOOP
        SELECT hr.base, hr.ts INTO v_base, v_ts FROM streamd.head_reserve(p_stream_name, r.p, r.cnt::integer) hr;
        IF v_base IS NULL THEN -- the stream was deleted while this waited: SD001
            PERFORM streamd.raise_partition_missing(p_stream_name, r.p);
        END IF;
        v_bp := v_bp || r.p;
        v_bo := v_bo || v_base;
        v_bt := v_bt || v_ts;
    END LOOP;
    PERFORM streamd.append_recheck_rules(p_stream_name, v_stream.key_versions, v_stream.enforce_event_types);

    SELECT array_agg(CASE WHEN x.d THEN NULL ELSE b.base + x.rn - 1 END ORDER BY x.i), array_agg(b.ts ORDER BY x.i)
      INTO v_offs, v_tss
      FROM (SELECT u.i, u.p, u.d, row_number() OVER (PARTITION BY u.p, u.d ORDER BY u.i) AS rn
              FROM unnest(v_parts, v_dup) WITH ORDINALITY AS u(p, d, i)) x
      LEFT JOIN unnest(v_bp, v_bo, v_bt) AS b(p, base, ts) ON b.p = x.p;

    PERFORM set_config('streamd.append_trusted', 'on', true);
    INSERT INTO streamd.events AS e (stream_name, partition, "offset", event_id, event_type, key, data, data_bytes,
                                     metadata, "timestamp", correlation_id, causation_id, version, key_version)
    SELECT p_stream_name, u.p, u.o, u.e, coalesce(u.t, ''), u.k, u.d::jsonb, u.b, u.m::jsonb, u.ts, u.c, u.ca, coalesce(u.v, 1), u.kv
      FROM unnest(v_parts, v_offs, v_ids,
                  coalesce(p_event_types, array_fill(NULL::text, ARRAY[v_n])),
                  v_keys,
                  coalesce(p_data, array_fill(NULL::text, ARRAY[v_n])),
                  coalesce(p_data_bytes, array_fill(NULL::bytea, ARRAY[v_n])),
                  coalesce(p_metadata, array_fill(NULL::text, ARRAY[v_n])),
                  v_tss,
                  coalesce(p_correlation_ids, array_fill(NULL::text, ARRAY[v_n])),
                  coalesce(p_causation_ids, array_fill(NULL::text, ARRAY[v_n])),
                  coalesce(p_versions, array_fill(NULL::integer, ARRAY[v_n])),
                  coalesce(v_kv, array_fill(NULL::bigint, ARRAY[v_n])),
                  v_dup)
           AS u(p, o, e, t, k, d, b, m, ts, c, ca, v, kv, dup)
     WHERE NOT u.dup
     ORDER BY u.p, u.o;
    PERFORM set_config('streamd.append_trusted', 'off', true);

    RETURN QUERY
        SELECT u.i::integer, e.partition, e."offset", e."timestamp", u.d, e.key_version
          FROM unnest(v_ids, v_dup) WITH ORDINALITY AS u(id, d, i)
          JOIN streamd.events e ON e.stream_name = p_stream_name AND e.event_id = u.id
         ORDER BY u.i;
END;
$$;

-- Turns key versions and event type enforcement on or off for a stream. Takes the
-- stream's head rows (and writes them: see below), so it waits for appends in flight;
-- an append that read the old settings and waited for those rows fails with 40001 to
-- be retried (streamd.append_recheck_rules under READ COMMITTED, the head row's new
-- version under REPEATABLE READ), so none runs half under the old rule. Turning key
-- versions on for a stream that holds keyed events numbers only the events appended
-- from then on (the earlier ones keep key_version NULL).
CREATE OR REPLACE FUNCTION streamd.set_stream_event_sourcing(p_stream_name text, p_key_versions boolean, p_enforce_event_types boolean)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_key_versions IS NULL OR p_enforce_event_types IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = 'set_stream_event_sourcing: key_versions and enforce_event_types must not be NULL';
    END IF;
    PERFORM 1 FROM streamd.streams s WHERE s.stream_name = p_stream_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM streamd.raise_partition_missing(p_stream_name, 0);
    END IF;
    PERFORM 1 FROM streamd.stream_partitions h WHERE h.stream_name = p_stream_name ORDER BY h.partition FOR NO KEY UPDATE;
    -- A new version of each head row, not only a lock: an append in a REPEATABLE READ
    -- (or SERIALIZABLE) transaction read the old settings in its snapshot and would
    -- not see the new ones on a re-check; updating a row updated since its snapshot
    -- fails it with 40001 instead (TestAppendRacingASettingsChangeIsRetried/repeatable_read).
    UPDATE streamd.stream_partitions h SET next_offset = h.next_offset WHERE h.stream_name = p_stream_name;
    UPDATE streamd.streams s
       SET key_versions = p_key_versions, enforce_event_types = p_enforce_event_types, updated_at = now()
     WHERE s.stream_name = p_stream_name;
END;
$$;

-- Raises SD001/SD003 for a missing stream and SD405 for one without key versions.
CREATE OR REPLACE FUNCTION streamd.require_key_versions(p_stream_name text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_on boolean;
BEGIN
    SELECT s.key_versions INTO v_on FROM streamd.streams s WHERE s.stream_name = p_stream_name;
    IF NOT FOUND THEN
        PERFORM streamd.raise_partition_missing(p_stream_name, 0);
    END IF;
    IF NOT v_on THEN
        RAISE EXCEPTION USING ERRCODE = 'SD405',
            MESSAGE = format('stream %L does not keep key versions (streamd.set_stream_event_sourcing)', p_stream_name);
    END IF;
END;
$$;

-- Opens (or renews) an exclusive writer session on a key: the key is held by
-- p_session_id until the returned time. Succeeds when nobody holds the key, its holder
-- expired, or p_session_id already holds it; raises SD404 when another live session
-- holds it (the caller retries until its open timeout). Waits for an append in flight
-- on the key to commit (row lock on the key head): at most p_lock_wait when given
-- (then lock_not_available, 55P03, which the caller retries like SD404), else as
-- long as the lock_timeout setting lets it.
CREATE OR REPLACE FUNCTION streamd.open_key_session(p_stream_name text, p_key text, p_session_id text, p_timeout interval, p_now timestamptz,
                                                    p_lock_wait interval DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := coalesce(p_now, clock_timestamp());
    v_exp  timestamptz;
    v_sid  text;
    v_lock text;
BEGIN
    PERFORM streamd.require_key_versions(p_stream_name);
    IF p_key IS NULL OR p_key = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = 'open session: the key must not be empty';
    END IF;
    IF p_session_id IS NULL OR p_session_id = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = 'open session: the session id must not be empty';
    END IF;
    IF p_timeout IS NULL OR p_timeout <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = format('open session: the session timeout must be positive, got %s', p_timeout);
    END IF;
    IF p_lock_wait IS NOT NULL THEN
        IF p_lock_wait <= interval '0' THEN
            RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = format('open session: the lock wait must be positive, got %s', p_lock_wait);
        END IF;
        -- Transaction-local and put back below; a raise rolls it back with the
        -- (sub)transaction, so the caller's setting survives either way.
        v_lock := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', least(ceil(extract(epoch FROM p_lock_wait) * 1000), 2147483647)::bigint::text || 'ms', true);
    END IF;
    INSERT INTO streamd.key_heads AS h (stream_name, key, last_version, session_id, session_expires_at, updated_at)
    VALUES (p_stream_name, p_key, 0, p_session_id, v_now + p_timeout, v_now)
    ON CONFLICT (stream_name, key) DO UPDATE
       SET session_id = excluded.session_id, session_expires_at = excluded.session_expires_at, updated_at = excluded.updated_at
     WHERE h.session_id IS NULL OR h.session_id = excluded.session_id OR h.session_expires_at <= v_now
    RETURNING h.session_expires_at INTO v_exp;
    IF p_lock_wait IS NOT NULL THEN
        PERFORM set_config('lock_timeout', v_lock, true);
    END IF;
    IF v_exp IS NULL THEN
        SELECT h.session_id, h.session_expires_at INTO v_sid, v_exp
          FROM streamd.key_heads h WHERE h.stream_name = p_stream_name AND h.key = p_key;
        RAISE EXCEPTION USING ERRCODE = 'SD404',
            MESSAGE = format('key %L of stream %L is held by another session until %s', p_key, p_stream_name, v_exp);
    END IF;
    RETURN v_exp;
END;
$$;

-- Renews a session: it holds the key again until now + p_timeout, provided the key is
-- still its own (expired, perhaps, but nobody wrote or took it since). Otherwise the
-- renewed holder would not know it had lost exclusive access in between (as
-- open_key_session would take the key back silently), so renewal fails, with the
-- errors of an append in the session: SD404 when another live session holds the key;
-- SD402 when nobody does (closed or released by SQL, a takeover that was closed or
-- expired since, or an append outside any session that ended the expired hold).
CREATE OR REPLACE FUNCTION streamd.renew_key_session(p_stream_name text, p_key text, p_session_id text, p_timeout interval, p_now timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_exp timestamptz;
    v_sid text;
BEGIN
    IF p_timeout IS NULL OR p_timeout <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = format('renew session: the session timeout must be positive, got %s', p_timeout);
    END IF;
    UPDATE streamd.key_heads h SET session_expires_at = v_now + p_timeout, updated_at = v_now
     WHERE h.stream_name = p_stream_name AND h.key = p_key AND h.session_id = p_session_id
    RETURNING h.session_expires_at INTO v_exp;
    IF v_exp IS NULL THEN
        SELECT h.session_id, h.session_expires_at INTO v_sid, v_exp
          FROM streamd.key_heads h WHERE h.stream_name = p_stream_name AND h.key = p_key;
        IF v_sid IS NOT NULL AND v_exp > v_now THEN
            RAISE EXCEPTION USING ERRCODE = 'SD404',
                MESSAGE = format('key %L of stream %L is held by another session than %L until %s',
                                 p_key, p_stream_name, p_session_id, v_exp);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'SD402',
            MESSAGE = format('key %L of stream %L is no longer held by session %L (closed, released, or written or taken over since it expired)',
                             p_key, p_stream_name, p_session_id);
    END IF;
    RETURN v_exp;
END;
$$;

-- Closes a session: the key is free at once. Returns false when p_session_id did not
-- hold the key (never opened, closed already, or taken over after it expired).
CREATE OR REPLACE FUNCTION streamd.close_key_session(p_stream_name text, p_key text, p_session_id text)
RETURNS boolean
LANGUAGE sql AS $$
    WITH c AS (
        UPDATE streamd.key_heads h SET session_id = NULL, session_expires_at = NULL
         WHERE h.stream_name = p_stream_name AND h.key = p_key AND h.session_id = p_session_id
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM c)
$$;

-- Stores the state of a key at version p_version (replacing a snapshot at that version).
-- The version must be one the key has reached (SD005 otherwise). With p_session_id, the
-- session must hold the key, as for an append (SD402, SD403, SD404).
CREATE OR REPLACE FUNCTION streamd.save_snapshot(p_stream_name text, p_key text, p_version bigint, p_data text,
                                                 p_data_bytes bytea, p_session_id text, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := coalesce(p_now, clock_timestamp());
    v_head streamd.key_heads%ROWTYPE;
BEGIN
    PERFORM streamd.require_key_versions(p_stream_name);
    IF (p_data IS NULL) = (p_data_bytes IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = 'snapshot: give exactly one of a JSON and a binary state';
    END IF;
    SELECT * INTO v_head FROM streamd.key_heads h WHERE h.stream_name = p_stream_name AND h.key = p_key FOR SHARE;
    IF p_version IS NULL OR p_version < 1 OR p_version > coalesce(v_head.last_version, 0) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('snapshot of key %L of stream %L at version %s: the key is at version %s',
                             p_key, p_stream_name, p_version, coalesce(v_head.last_version, 0));
    END IF;
    IF p_session_id IS NOT NULL THEN
        IF v_head.session_id IS DISTINCT FROM p_session_id THEN
            IF v_head.session_id IS NOT NULL AND v_head.session_expires_at > v_now THEN
                RAISE EXCEPTION USING ERRCODE = 'SD404',
                    MESSAGE = format('key %L of stream %L is held by another session', p_key, p_stream_name);
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'SD402',
                MESSAGE = format('key %L of stream %L is not open in session %L', p_key, p_stream_name, p_session_id);
        ELSIF v_head.session_expires_at <= v_now THEN
            RAISE EXCEPTION USING ERRCODE = 'SD403',
                MESSAGE = format('session %L on key %L of stream %L expired at %s', p_session_id, p_key, p_stream_name, v_head.session_expires_at);
        END IF;
    END IF;
    INSERT INTO streamd.snapshots AS s (stream_name, key, key_version, data, data_bytes, created_at)
    VALUES (p_stream_name, p_key, p_version, p_data::jsonb, p_data_bytes, v_now)
    ON CONFLICT (stream_name, key, key_version) DO UPDATE
       SET data = excluded.data, data_bytes = excluded.data_bytes, created_at = excluded.created_at;
END;
$$;

-- Registers an event type, or updates its description and reference table.
CREATE OR REPLACE FUNCTION streamd.register_event_type(p_name text, p_description text, p_reference_table text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_name IS NULL OR p_name = '' OR length(p_name) > 255 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = format('invalid event type name %L: use 1 to 255 characters', p_name);
    END IF;
    IF p_reference_table IS NOT NULL AND to_regclass(p_reference_table) IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('event type %L: reference table %L does not exist', p_name, p_reference_table);
    END IF;
    INSERT INTO streamd.event_types AS t (name, description, reference_table)
    VALUES (p_name, coalesce(p_description, ''), p_reference_table)
    ON CONFLICT (name) DO UPDATE
       SET description = excluded.description, reference_table = excluded.reference_table, updated_at = now();
END;
$$;
