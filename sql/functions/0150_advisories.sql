-- Advisories (docs/advisories.md): operational events appended to the stream
-- streamd.advisories on behalf of the SQL function that does the fact they report,
-- when its transaction commits, so an advisory exists exactly when its fact
-- committed. Applied idempotently on every migrate.
--
-- Lock order: advise only writes a row of streamd.advisory_outbox; a deferred
-- constraint trigger on it (migration 0088) appends the advisory at commit. So every
-- reporting transaction takes the advisory partition's head row last, after all its
-- other locks, and while it holds it waits for nothing else: reporting transactions
-- queue behind each other only for their appends at commit, and a transaction that
-- reports a fact and then appends to a stream can no longer deadlock with retention
-- of that stream (which reports after moving the stream's head). A caller that makes
-- the trigger immediate (SET CONSTRAINTS ALL IMMEDIATE) appends at the end of each
-- statement again and takes that risk back. One other deferred trigger takes a row at
-- commit: stream_set_changed (migration 0135) bumps streamd.stream_set_version when a
-- stream is created or deleted; no function both reports an advisory and creates or
-- deletes a stream, so the two never meet in one transaction.

-- Reports one advisory: event type p_type (one of docs/advisories.md's), key p_key
-- (the subject: a group as "<stream>/<group>", a queue, a stream, a lease), payload
-- p_data, appended when the calling transaction commits (nothing if it rolls back).
-- It never fails the fact it reports for the advisory's sake: when the stream
-- streamd.advisories was deleted or made read-only by then, or the calling role may
-- not append (insert into streamd.events, execute streamd.head_reserve), nothing is
-- written. The row gets the caller's tenant (the column default), so a tenant role's
-- advisories are its tenant's.
CREATE OR REPLACE FUNCTION streamd.advise(p_type text, p_key text, p_data jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT has_table_privilege('streamd.advisory_outbox', 'INSERT') THEN
        RETURN;
    END IF;
    INSERT INTO streamd.advisory_outbox (event_type, key, data) VALUES (p_type, p_key, jsonb_strip_nulls(p_data));
END;
$$;

-- The deferred trigger of streamd.advisory_outbox: appends the advisory at commit, as
-- the committing role, and deletes its row. Rows fire in the order they were written.
CREATE OR REPLACE FUNCTION streamd.advisory_outbox_flush() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM streamd.advisory_outbox o WHERE o.id = NEW.id;
    IF NOT has_table_privilege('streamd.events', 'INSERT')
       OR NOT has_function_privilege('streamd.head_reserve(text, integer, integer)', 'EXECUTE') THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM streamd.streams s WHERE s.stream_name = 'streamd.advisories' AND NOT s.read_only;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM streamd.append('streamd.advisories', NULL, NULL, ARRAY[NEW.event_type], ARRAY[NEW.key],
                           ARRAY[NEW.data::text], NULL, NULL, NULL, NULL, NULL);
    RETURN NULL;
END;
$$;

-- The assignment of a group as an advisory payload: per member, the partitions it
-- owns and those promised to it (moving once their owner releases them), and the
-- partitions nobody owns.
CREATE OR REPLACE FUNCTION streamd.advise_assignment(p_stream_name text, p_group_id text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'members', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'member', cr.consumer_id, 'epoch', cr.member_epoch, 'instance_id', cr.instance_id,
                       'owns', coalesce((SELECT jsonb_agg(cp.partition ORDER BY cp.partition) FROM streamd.consumer_partitions cp
                                          WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id
                                            AND cp.owner_id = cr.consumer_id), '[]'),
                       'incoming', coalesce((SELECT jsonb_agg(cp.partition ORDER BY cp.partition) FROM streamd.consumer_partitions cp
                                              WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id
                                                AND cp.target_id = cr.consumer_id), '[]'))
                     ORDER BY cr.consumer_id)
              FROM streamd.consumer_registrations cr
             WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id), '[]'),
        'unowned', coalesce((SELECT jsonb_agg(cp.partition ORDER BY cp.partition) FROM streamd.consumer_partitions cp
                              WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id
                                AND cp.owner_id IS NULL), '[]'))
$$;

-- A member that leaves its group other than by its own leave: expired (p_reason
-- session_timeout or rebalance_timeout: streamd.group.member_expired) or fenced by
-- someone else's act (instance_replaced, offsets_reset, group_deleted:
-- streamd.group.member_fenced). p_partitions: what it owned when it went. Called
-- before the member's rows change.
CREATE OR REPLACE FUNCTION streamd.advise_member_gone(p_stream_name text, p_group_id text, p_consumer_id text,
                                                      p_reason text, p_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT cr.member_epoch, cr.instance_id, cr.last_heartbeat, cr.session_timeout_ms,
           coalesce((SELECT jsonb_agg(cp.partition ORDER BY cp.partition) FROM streamd.consumer_partitions cp
                      WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id
                        AND cp.owner_id = p_consumer_id), '[]') AS owned
      INTO r
      FROM streamd.consumer_registrations cr
     WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id AND cr.consumer_id = p_consumer_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM streamd.advise(
        CASE WHEN p_reason IN ('session_timeout', 'rebalance_timeout') THEN 'streamd.group.member_expired'
             ELSE 'streamd.group.member_fenced' END,
        p_stream_name || '/' || p_group_id,
        jsonb_build_object('stream', p_stream_name, 'group', p_group_id, 'member', p_consumer_id,
                           'epoch', r.member_epoch, 'instance_id', r.instance_id, 'reason', p_reason,
                           'last_heartbeat', r.last_heartbeat, 'session_timeout_ms', r.session_timeout_ms,
                           'partitions', r.owned, 'at', p_now));
END;
$$;

-- Retention moved partition p_partition of p_stream_name's log start from p_from to
-- p_to: reports (streamd.retention.unread_deleted) the live groups (a member inside its
-- session timeout, native or Kafka classic, as protect_consumers judges them) whose
-- committed offset was below p_to, with how many of their unread events went.
CREATE OR REPLACE FUNCTION streamd.advise_unread_deleted(p_stream_name text, p_partition integer,
                                                         p_from bigint, p_to bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_groups jsonb;
BEGIN
    IF p_to IS NULL OR p_to <= coalesce(p_from, 0) THEN
        RETURN;
    END IF;
    SELECT jsonb_agg(jsonb_build_object('group', co.group_id, 'committed_offset', co."offset",
                                        'unread_deleted', p_to - greatest(co."offset", p_from))
                     ORDER BY co.group_id)
      INTO v_groups
      FROM streamd.consumer_offsets co
     WHERE co.stream_name = p_stream_name AND co.partition = p_partition AND co."offset" < p_to
       AND (EXISTS (SELECT 1 FROM streamd.consumer_registrations cr
                     WHERE cr.stream_name = co.stream_name AND cr.group_id = co.group_id
                       AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= now())
            OR EXISTS (SELECT 1 FROM streamd.kafka_group_members km
                        WHERE km.group_id = co.group_id
                          AND (cardinality(km.topics) = 0 OR co.stream_name = ANY (km.topics))
                          AND km.last_heartbeat + km.session_timeout_ms * interval '1 millisecond' >= now()));
    IF v_groups IS NULL THEN
        RETURN;
    END IF;
    PERFORM streamd.advise('streamd.retention.unread_deleted', p_stream_name,
        jsonb_build_object('stream', p_stream_name, 'partition', p_partition, 'previous_log_start_offset', p_from,
                           'log_start_offset', p_to, 'groups', v_groups));
END;
$$;

