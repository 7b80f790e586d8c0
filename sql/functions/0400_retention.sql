-- Retention: deleting a prefix of each partition by age, count or size, and key
-- compaction. Applied idempotently on every migrate.
--
-- Errors (class SD3xx, mapped in retention/errors.go and streamconfig/errors.go):
--   SD301 invalid stream configuration   SD302 invalid retention argument
--   SD303 no retention policy for the stream
--
-- How a prefix goes: timestamps are monotonic per partition and offsets gapless, so
-- every limit is a "new log start offset" per partition, and retention deletes the
-- rows below it and advances stream_partitions.log_start_offset to it. A fetch below
-- the log start then fails with SD007 (streams.OffsetOutOfRangeError).
--
-- Two ways to run it:
--   * one transaction (the seed's apply_time_retention / apply_size_retention,
--     apply_retention, apply_policy): deletes first and updates the head rows last,
--     so appends to a partition wait only from that UPDATE to the commit;
--   * bounded batches (the Go scheduler, retention/): retention_advance moves the log
--     start in its own short transaction (readers stop seeing the prefix at once),
--     then retention_delete_batch removes at most N rows below it per transaction.
-- Appends hold their head rows until they commit, so retention_advance waits for the
-- appends in flight on that partition and for nothing else.

-- The new log start offset of every partition of a stream under the given limits (NULL
-- = no limit), without changing anything. limited_by names the live group whose
-- committed offset held the target back when p_protect_consumers is set.
CREATE OR REPLACE FUNCTION streamd.retention_targets(
    p_stream_name       text,
    p_max_age_seconds   integer,
    p_max_event_count   bigint,
    p_max_size_bytes    bigint,
    p_protect_consumers boolean,
    p_now               timestamptz
) RETURNS TABLE (partition integer, log_start_offset bigint, next_offset bigint, target_offset bigint, limited_by text)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := coalesce(p_now, now());
    h        record;
    r        record;
    v_target bigint;
    v_cum    bigint;
    v_group  text;
    v_min    bigint;
BEGIN
    IF p_max_age_seconds IS NOT NULL AND p_max_age_seconds <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD302',
            MESSAGE = format('max_age_seconds must be positive, got %s', p_max_age_seconds);
    END IF;
    IF p_max_event_count IS NOT NULL AND p_max_event_count < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD302',
            MESSAGE = format('max_event_count must not be negative, got %s', p_max_event_count);
    END IF;
    IF p_max_size_bytes IS NOT NULL AND p_max_size_bytes < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD302',
            MESSAGE = format('max_size_bytes must not be negative, got %s', p_max_size_bytes);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM streamd.streams s WHERE s.stream_name = p_stream_name) THEN
        PERFORM streamd.raise_partition_missing(p_stream_name, 0);
    END IF;

    FOR h IN SELECT sp.partition, sp.log_start_offset, sp.next_offset
               FROM streamd.stream_partitions sp
              WHERE sp.stream_name = p_stream_name
              ORDER BY sp.partition LOOP
        v_target := h.log_start_offset;
        IF p_max_age_seconds IS NOT NULL THEN
            -- Rows older than the cutoff form a prefix: binary search, no scan.
            v_target := greatest(v_target, streamd.offset_for_time(p_stream_name, h.partition,
                                                                    v_now - make_interval(secs => p_max_age_seconds)));
        END IF;
        IF p_max_event_count IS NOT NULL THEN
            -- Offsets are gapless: keeping the last N offsets keeps exactly N events.
            v_target := greatest(v_target, h.next_offset - p_max_event_count);
        END IF;
        IF p_max_size_bytes IS NOT NULL THEN
            -- Walk back from the log end summing stored payload sizes (pg_column_size
            -- does not de-TOAST) until the limit is passed: reads the retained rows.
            v_cum := 0;
            FOR r IN SELECT e."offset" AS o,
                            coalesce(pg_column_size(e.data), 0) + coalesce(pg_column_size(e.data_bytes), 0) AS sz
                       FROM streamd.events e
                      WHERE e.stream_name = p_stream_name AND e.partition = h.partition
                        AND e."offset" >= v_target AND e."offset" < h.next_offset
                      ORDER BY e."offset" DESC LOOP
                v_cum := v_cum + r.sz;
                IF v_cum > p_max_size_bytes THEN
                    v_target := greatest(v_target, r.o + 1);
                    EXIT;
                END IF;
            END LOOP;
        END IF;
        v_target := least(v_target, h.next_offset);

        limited_by := NULL;
        IF p_protect_consumers AND v_target > h.log_start_offset THEN
            -- The slowest live group (a member inside its session timeout) on this
            -- partition. Groups with no commit here have nothing to protect yet.
            -- Liveness is judged by the database's clock, which stamps heartbeats,
            -- unless p_now is earlier: a caller whose clock runs ahead must not take
            -- live groups for dead ones and delete what they have not read.
            SELECT co.group_id, co."offset" INTO v_group, v_min
              FROM streamd.consumer_offsets co
             WHERE co.stream_name = p_stream_name AND co.partition = h.partition
               AND (EXISTS (SELECT 1 FROM streamd.consumer_registrations cr
                             WHERE cr.stream_name = co.stream_name AND cr.group_id = co.group_id
                               AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= least(v_now, now()))
                    -- A Kafka classic group with a live member subscribed to the stream.
                    OR EXISTS (SELECT 1 FROM streamd.kafka_group_members km
                                WHERE km.group_id = co.group_id
                                  AND (cardinality(km.topics) = 0 OR co.stream_name = ANY (km.topics))
                                  AND km.last_heartbeat + km.session_timeout_ms * interval '1 millisecond' >= least(v_now, now())))
             ORDER BY co."offset", co.group_id
             LIMIT 1;
            IF FOUND AND v_min < v_target THEN
                v_target := greatest(v_min, h.log_start_offset);
                limited_by := v_group;
            END IF;
        END IF;

        partition := h.partition;
        log_start_offset := h.log_start_offset;
        next_offset := h.next_offset;
        target_offset := v_target;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Key compaction of one partition: deletes every keyed record that a later record
-- with the same key supersedes, and the latest record of a key when it is a tombstone
-- (data and data_bytes NULL) older than p_tombstone_retention_seconds. Only offsets at
-- or above greatest(p_from, log start) are considered. Keyless records are kept. A
-- key is the text key or the byte key (key_bytes: Kafka keys that are not text, and
-- the empty key); a key that is text is always stored as text, so the two never hold
-- the same key, except the empty one ('' and '\x'), which is one key either way.
-- Returns the rows deleted (or, with p_dry_run, that would be). Leaves holes in the
-- offsets, which readers skip; the log start does not move. Reads the partition once.
CREATE OR REPLACE FUNCTION streamd.compact_partition(
    p_stream_name                 text,
    p_partition                   integer,
    p_from                        bigint,
    p_tombstone_retention_seconds integer,
    p_now                         timestamptz,
    p_dry_run                     boolean
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_from   bigint;
    v_cutoff timestamptz := coalesce(p_now, now()) - make_interval(secs => coalesce(p_tombstone_retention_seconds, 0));
    v_n      bigint;
BEGIN
    IF p_dry_run IS NULL THEN -- a NULL must not mean "delete"
        RAISE EXCEPTION USING ERRCODE = 'SD302', MESSAGE = 'compact_partition: dry_run must be true or false, got NULL';
    END IF;
    IF p_tombstone_retention_seconds < 0 THEN -- a cutoff in the future would drop every tombstone
        RAISE EXCEPTION USING ERRCODE = 'SD302',
            MESSAGE = format('compact_partition: tombstone_retention_seconds must not be negative, got %s', p_tombstone_retention_seconds);
    END IF;
    SELECT greatest(h.log_start_offset, coalesce(p_from, 0)) INTO v_from
      FROM streamd.stream_partitions h WHERE h.stream_name = p_stream_name AND h.partition = p_partition;
    IF NOT FOUND THEN
        PERFORM streamd.raise_partition_missing(p_stream_name, p_partition);
    END IF;
    IF p_dry_run THEN
        SELECT count(*) INTO v_n
          FROM streamd.events e
          JOIN (SELECT coalesce(l.key, '') AS k, coalesce(l.key_bytes, '\x') AS kb, max(l."offset") AS last
                  FROM streamd.events l
                 WHERE l.stream_name = p_stream_name AND l.partition = p_partition
                   AND l."offset" >= v_from AND (l.key IS NOT NULL OR l.key_bytes IS NOT NULL)
                 GROUP BY 1, 2) m ON m.k = coalesce(e.key, '') AND m.kb = coalesce(e.key_bytes, '\x')
         WHERE e.stream_name = p_stream_name AND e.partition = p_partition AND e."offset" >= v_from
           AND (e.key IS NOT NULL OR e.key_bytes IS NOT NULL)
           AND (e."offset" < m.last
                OR (e.data IS NULL AND e.data_bytes IS NULL AND e."timestamp" < v_cutoff));
        RETURN v_n;
    END IF;
    DELETE FROM streamd.events e
     USING (SELECT coalesce(l.key, '') AS k, coalesce(l.key_bytes, '\x') AS kb, max(l."offset") AS last
              FROM streamd.events l
             WHERE l.stream_name = p_stream_name AND l.partition = p_partition
               AND l."offset" >= v_from AND (l.key IS NOT NULL OR l.key_bytes IS NOT NULL)
             GROUP BY 1, 2) m
     WHERE e.stream_name = p_stream_name AND e.partition = p_partition AND e."offset" >= v_from
       AND (e.key IS NOT NULL OR e.key_bytes IS NOT NULL)
       AND m.k = coalesce(e.key, '') AND m.kb = coalesce(e.key_bytes, '\x')
       AND (e."offset" < m.last
            OR (e.data IS NULL AND e.data_bytes IS NULL AND e."timestamp" < v_cutoff));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

-- Retention of one stream under explicit limits, in the calling transaction. For each
-- partition: deleted = rows below the new log start (counted, with p_dry_run), and
-- compacted = rows compaction removes above it when p_cleanup_policy includes
-- 'compact'. A dry run returns exactly the counts a real run at the same p_now
-- would, as long as nothing else deletes in between. The head rows are updated last,
-- in partition order.
CREATE OR REPLACE FUNCTION streamd.retention_execute(
    p_stream_name                 text,
    p_max_age_seconds             integer,
    p_max_event_count             bigint,
    p_max_size_bytes              bigint,
    p_protect_consumers           boolean,
    p_cleanup_policy              text,
    p_tombstone_retention_seconds integer,
    p_now                         timestamptz,
    p_dry_run                     boolean
) RETURNS TABLE (partition integer, log_start_offset bigint, next_offset bigint, new_log_start_offset bigint,
                 deleted bigint, compacted bigint, limited_by text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_policy text := coalesce(p_cleanup_policy, 'delete');
    t        record;
    v_parts  integer[] := '{}';
    v_tgts   bigint[] := '{}';
    v_froms  bigint[] := '{}';
    i        integer;
BEGIN
    IF v_policy NOT IN ('delete', 'compact', 'compact,delete') THEN
        RAISE EXCEPTION USING ERRCODE = 'SD302',
            MESSAGE = format('cleanup_policy must be delete, compact or compact,delete, got %L', v_policy);
    END IF;
    IF p_tombstone_retention_seconds IS NOT NULL AND p_tombstone_retention_seconds < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD302',
            MESSAGE = format('tombstone_retention_seconds must not be negative, got %s', p_tombstone_retention_seconds);
    END IF;
    FOR t IN SELECT * FROM streamd.retention_targets(
                 p_stream_name,
                 CASE WHEN v_policy <> 'compact' THEN p_max_age_seconds END,
                 CASE WHEN v_policy <> 'compact' THEN p_max_event_count END,
                 CASE WHEN v_policy <> 'compact' THEN p_max_size_bytes END,
                 p_protect_consumers, p_now) LOOP
        IF p_dry_run THEN
            SELECT count(*) INTO deleted FROM streamd.events e
             WHERE e.stream_name = p_stream_name AND e.partition = t.partition AND e."offset" < t.target_offset;
        ELSE
            DELETE FROM streamd.events e
             WHERE e.stream_name = p_stream_name AND e.partition = t.partition AND e."offset" < t.target_offset;
            GET DIAGNOSTICS deleted = ROW_COUNT;
        END IF;
        compacted := 0;
        IF v_policy LIKE 'compact%' THEN
            compacted := streamd.compact_partition(p_stream_name, t.partition, t.target_offset,
                                                   coalesce(p_tombstone_retention_seconds, 86400), p_now, p_dry_run);
        END IF;
        partition := t.partition;
        log_start_offset := t.log_start_offset;
        next_offset := t.next_offset;
        new_log_start_offset := t.target_offset;
        limited_by := t.limited_by;
        IF t.target_offset > t.log_start_offset THEN
            v_parts := v_parts || t.partition;
            v_tgts := v_tgts || t.target_offset;
            v_froms := v_froms || t.log_start_offset;
        END IF;
        RETURN NEXT;
    END LOOP;
    IF NOT p_dry_run THEN
        FOR i IN 1 .. coalesce(cardinality(v_parts), 0) LOOP
            UPDATE streamd.stream_partitions h
               SET log_start_offset = greatest(h.log_start_offset, v_tgts[i])
             WHERE h.stream_name = p_stream_name AND h.partition = v_parts[i];
            PERFORM streamd.advise_unread_deleted(p_stream_name, v_parts[i], v_froms[i], v_tgts[i]);
        END LOOP;
    END IF;
END;
$$;

-- Retention of one stream under its policy in retention_policies (SD303 when it has
-- none). p_force ignores protect_consumers. Returns retention_execute's rows.
CREATE OR REPLACE FUNCTION streamd.apply_policy(
    p_stream_name text,
    p_now         timestamptz DEFAULT NULL,
    p_force       boolean DEFAULT false,
    p_dry_run     boolean DEFAULT false
) RETURNS TABLE (partition integer, log_start_offset bigint, next_offset bigint, new_log_start_offset bigint,
                 deleted bigint, compacted bigint, limited_by text)
LANGUAGE plpgsql AS $$
DECLARE
    p streamd.retention_policies%ROWTYPE;
BEGIN
    SELECT * INTO p FROM streamd.retention_policies rp WHERE rp.stream_name = p_stream_name;
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT 1 FROM streamd.streams s WHERE s.stream_name = p_stream_name) THEN
            PERFORM streamd.raise_partition_missing(p_stream_name, 0);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'SD303',
            MESSAGE = format('stream %L has no retention policy', p_stream_name);
    END IF;
    RETURN QUERY SELECT * FROM streamd.retention_execute(
        p_stream_name, p.max_age_seconds, p.max_event_count, p.max_size_bytes,
        p.protect_consumers AND NOT coalesce(p_force, false), p.cleanup_policy,
        p.tombstone_retention_seconds, p_now, coalesce(p_dry_run, false));
END;
$$;

-- Seed 003: deletes the events of a stream older than p_max_age_seconds and returns
-- how many. Honours the stream's protect_consumers setting when it has a policy.
CREATE OR REPLACE FUNCTION streamd.apply_time_retention(p_stream_name text, p_max_age_seconds integer)
RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    IF p_max_age_seconds IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD302', MESSAGE = 'max_age_seconds must be given';
    END IF;
    RETURN (SELECT coalesce(sum(x.deleted), 0)::integer
              FROM streamd.retention_execute(
                   p_stream_name, p_max_age_seconds, NULL, NULL,
                   coalesce((SELECT rp.protect_consumers FROM streamd.retention_policies rp
                              WHERE rp.stream_name = p_stream_name), false),
                   'delete', NULL, NULL, false) x);
END;
$$;

-- Seed 003: keeps exactly the last p_max_event_count events of each partition of a
-- stream (the seed's version kept one more) and returns how many it deleted. Honours
-- the stream's protect_consumers setting when it has a policy.
CREATE OR REPLACE FUNCTION streamd.apply_size_retention(p_stream_name text, p_max_event_count integer)
RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    IF p_max_event_count IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD302', MESSAGE = 'max_event_count must be given';
    END IF;
    RETURN (SELECT coalesce(sum(x.deleted), 0)::integer
              FROM streamd.retention_execute(
                   p_stream_name, NULL, p_max_event_count, NULL,
                   coalesce((SELECT rp.protect_consumers FROM streamd.retention_policies rp
                              WHERE rp.stream_name = p_stream_name), false),
                   'delete', NULL, NULL, false) x);
END;
$$;

-- Every enabled policy, in one transaction (for SQL users and pg_cron; the Go
-- scheduler runs each partition in bounded batches instead). One row per stream.
CREATE OR REPLACE FUNCTION streamd.apply_retention(p_now timestamptz DEFAULT NULL)
RETURNS TABLE (stream_name text, deleted_events bigint, compacted_events bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_stream text;
BEGIN
    -- The advisory stream last: its head row is the one every transaction takes last
    -- (its advisories, appended at commit: sql/functions/0150_advisories.sql), so this
    -- one must not hold it while it goes on to lock other streams' head rows.
    FOR v_stream IN SELECT rp.stream_name FROM streamd.retention_policies rp WHERE rp.enabled
                     ORDER BY rp.stream_name = 'streamd.advisories', rp.stream_name LOOP
        stream_name := v_stream;
        SELECT coalesce(sum(x.deleted), 0), coalesce(sum(x.compacted), 0) INTO deleted_events, compacted_events
          FROM streamd.apply_policy(v_stream, p_now, false, false) x;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Bounded-batch step 1: moves a partition's log start up to p_target (never past the
-- log end, never down) and returns the log start. Run it in its own transaction: it
-- locks the head row, so it waits for appends in flight on the partition and holds
-- the lock only until it commits.
CREATE OR REPLACE FUNCTION streamd.retention_advance(p_stream_name text, p_partition integer, p_target bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_ls   bigint;
    v_from bigint;
BEGIN
    IF p_target IS NULL OR p_target < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD302', MESSAGE = format('target offset must not be negative, got %s', p_target);
    END IF;
    -- The log start before the move, for the advisory: the row is locked first, so
    -- no other move comes between this read and the update.
    SELECT h.log_start_offset INTO v_from FROM streamd.stream_partitions h
     WHERE h.stream_name = p_stream_name AND h.partition = p_partition FOR NO KEY UPDATE;
    UPDATE streamd.stream_partitions h
       SET log_start_offset = greatest(h.log_start_offset, least(p_target, h.next_offset))
     WHERE h.stream_name = p_stream_name AND h.partition = p_partition
    RETURNING h.log_start_offset INTO v_ls;
    IF NOT FOUND THEN
        PERFORM streamd.raise_partition_missing(p_stream_name, p_partition);
    END IF;
    PERFORM streamd.advise_unread_deleted(p_stream_name, p_partition, v_from, v_ls);
    RETURN v_ls;
END;
$$;

-- Bounded-batch step 2: deletes up to p_limit of the lowest rows below the partition's
-- log start and returns how many (0 when none are left). Takes no head-row lock.
CREATE OR REPLACE FUNCTION streamd.retention_delete_batch(p_stream_name text, p_partition integer, p_limit integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_ls bigint;
    v_lo bigint;
    v_n  integer;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD302', MESSAGE = format('batch limit must be positive, got %s', p_limit);
    END IF;
    SELECT h.log_start_offset INTO v_ls
      FROM streamd.stream_partitions h WHERE h.stream_name = p_stream_name AND h.partition = p_partition;
    IF NOT FOUND THEN
        PERFORM streamd.raise_partition_missing(p_stream_name, p_partition);
    END IF;
    SELECT e."offset" INTO v_lo FROM streamd.events e
     WHERE e.stream_name = p_stream_name AND e.partition = p_partition AND e."offset" < v_ls
     ORDER BY e."offset" LIMIT 1;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    DELETE FROM streamd.events e
     WHERE e.stream_name = p_stream_name AND e.partition = p_partition
       AND e."offset" >= v_lo AND e."offset" < least(v_ls, v_lo + p_limit);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;
