-- Kafka classic-protocol groups: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, the
-- generation-fenced OffsetCommit, DeleteGroups and OffsetDelete (tables in migration
-- 0050_kafka_groups.sql). The Go side is consumergroup.Classic; its classic.go maps
-- these SQLSTATEs (besides SD102-SD105 of 0200_consumer_groups.sql):
--   SD150 unknown member           SD151 inconsistent group protocol
--   SD152 fenced instance id       SD153 illegal generation
--   SD154 rebalance in progress
--
-- The state machine is Kafka's (Empty, PreparingRebalance, CompletingRebalance,
-- Stable), kept in streamd.kafka_groups, so every instance coordinates every group.
-- Nothing here waits: a JoinGroup or SyncGroup that must wait for other members polls
-- (kafka_group_join_poll, kafka_group_sync), and every poll and heartbeat first runs
-- kg_maintain, which expires dead members and completes a rebalance whose members have
-- all rejoined or whose deadline passed. A waiting poll counts as the member's
-- heartbeat (Kafka's members do not heartbeat while their JoinGroup is pending), so a
-- member whose connection died with its request is expired after its session timeout.
--
-- Lock order: the kafka_groups row (FOR NO KEY UPDATE for changes, FOR SHARE for
-- commits), then kafka_group_members rows, then consumer_groups and consumer_offsets
-- rows in (stream, partition) order. Polls and heartbeats that change nothing but the
-- member's own last_heartbeat take only that member's row.

-- Locks the group row (FOR NO KEY UPDATE), creating the group when p_create. Raises
-- SD103 for an invalid group id; returns NULL fields when the group does not exist.
CREATE OR REPLACE FUNCTION streamd.kg_lock(p_group_id text, p_create boolean)
RETURNS streamd.kafka_groups
LANGUAGE plpgsql AS $$
DECLARE
    v_group streamd.kafka_groups%ROWTYPE;
BEGIN
    IF NOT streamd.cg_valid_group_id(p_group_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD103',
            MESSAGE = format('invalid group id %L: use 1 to 249 characters of A-Z a-z 0-9 . _ : -', p_group_id);
    END IF;
    IF p_create THEN
        INSERT INTO streamd.kafka_groups (group_id) VALUES (p_group_id) ON CONFLICT DO NOTHING;
    END IF;
    SELECT * INTO v_group FROM streamd.kafka_groups g WHERE g.group_id = p_group_id FOR NO KEY UPDATE;
    RETURN v_group;
END;
$$;

-- Starts a rebalance (PreparingRebalance) unless one is under way: every member must
-- rejoin before the rebalance deadline (now plus the largest rebalance timeout) or is
-- removed. The caller holds the group lock.
CREATE OR REPLACE FUNCTION streamd.kg_prepare(p_group_id text, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE streamd.kafka_groups g
       SET state = 'PreparingRebalance', updated_at = p_now,
           rebalance_deadline = p_now + (SELECT max(m.rebalance_timeout_ms) FROM streamd.kafka_group_members m
                                          WHERE m.group_id = p_group_id) * interval '1 millisecond'
     WHERE g.group_id = p_group_id AND g.state <> 'PreparingRebalance';
    IF FOUND THEN
        UPDATE streamd.kafka_group_members m SET joined = false WHERE m.group_id = p_group_id AND m.joined;
    END IF;
END;
$$;

-- Removes the members whose session expired, and, past a rebalance's deadline, those
-- that did not rejoin it; a removal in a formed generation starts a rebalance. Returns
-- how many were removed. The caller holds the group lock.
CREATE OR REPLACE FUNCTION streamd.kg_expire(p_group_id text, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM streamd.kafka_group_members m
     USING streamd.kafka_groups g
     WHERE m.group_id = p_group_id AND g.group_id = p_group_id
       AND (m.last_heartbeat + m.session_timeout_ms * interval '1 millisecond' < p_now
            OR (g.state = 'PreparingRebalance' AND g.rebalance_deadline < p_now AND NOT m.joined));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n > 0 THEN
        PERFORM streamd.kg_prepare(p_group_id, p_now);
    END IF;
    RETURN v_n;
END;
$$;

-- Completes a rebalance whose members have all rejoined: the next generation, with the
-- protocol (assignor) every member supports that most members prefer (ties: the
-- leader's order), led by the previous leader when it is still there, else by the
-- member that joined first; or Empty when no member is left. The caller holds the
-- group lock.
CREATE OR REPLACE FUNCTION streamd.kg_complete(p_group_id text, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_group    streamd.kafka_groups%ROWTYPE;
    v_leader   text;
    v_names    text[];
    v_protocol text;
BEGIN
    SELECT * INTO v_group FROM streamd.kafka_groups g WHERE g.group_id = p_group_id;
    IF v_group.state IS DISTINCT FROM 'PreparingRebalance'
       OR EXISTS (SELECT 1 FROM streamd.kafka_group_members m WHERE m.group_id = p_group_id AND NOT m.joined) THEN
        RETURN;
    END IF;
    SELECT m.member_id, m.protocol_names INTO v_leader, v_names FROM streamd.kafka_group_members m
     WHERE m.group_id = p_group_id
     ORDER BY (m.member_id = v_group.leader_id) DESC, m.join_seq
     LIMIT 1;
    IF v_leader IS NULL THEN
        UPDATE streamd.kafka_groups g
           SET state = 'Empty', generation = g.generation + 1, protocol_type = NULL, protocol_name = NULL,
               leader_id = NULL, rebalance_deadline = NULL, updated_at = p_now
         WHERE g.group_id = p_group_id;
        RETURN;
    END IF;
    WITH cand AS (
        SELECT c.p FROM unnest(v_names) AS c(p)
         WHERE NOT EXISTS (SELECT 1 FROM streamd.kafka_group_members m
                            WHERE m.group_id = p_group_id AND NOT (c.p = ANY (m.protocol_names)))
    ), votes AS (
        SELECT (SELECT x.p FROM unnest(m.protocol_names) WITH ORDINALITY AS x(p, i)
                 WHERE x.p IN (SELECT cand.p FROM cand) ORDER BY x.i LIMIT 1) AS vote
          FROM streamd.kafka_group_members m WHERE m.group_id = p_group_id
    )
    SELECT v.vote INTO v_protocol FROM votes v WHERE v.vote IS NOT NULL
     GROUP BY v.vote ORDER BY count(*) DESC, array_position(v_names, v.vote) LIMIT 1;
    UPDATE streamd.kafka_groups g
       SET state = 'CompletingRebalance', generation = g.generation + 1,
           protocol_name = coalesce(v_protocol, v_names[1]), leader_id = v_leader,
           rebalance_deadline = NULL, updated_at = p_now
     WHERE g.group_id = p_group_id;
    UPDATE streamd.kafka_group_members m
       SET generation = v_group.generation + 1, assignment = NULL, joined = false
     WHERE m.group_id = p_group_id;
END;
$$;

-- Expires dead members and completes a due rebalance, taking the group lock only when
-- there is something to do; returns the group row (NULL fields when there is none).
CREATE OR REPLACE FUNCTION streamd.kg_maintain(p_group_id text, p_now timestamptz)
RETURNS streamd.kafka_groups
LANGUAGE plpgsql AS $$
DECLARE
    v_group streamd.kafka_groups%ROWTYPE;
BEGIN
    SELECT * INTO v_group FROM streamd.kafka_groups g WHERE g.group_id = p_group_id;
    IF FOUND AND (EXISTS (SELECT 1 FROM streamd.kafka_group_members m
                           WHERE m.group_id = p_group_id
                             AND m.last_heartbeat + m.session_timeout_ms * interval '1 millisecond' < p_now)
                  OR (v_group.state = 'PreparingRebalance'
                      AND (v_group.rebalance_deadline < p_now
                           OR NOT EXISTS (SELECT 1 FROM streamd.kafka_group_members m
                                           WHERE m.group_id = p_group_id AND NOT m.joined)))) THEN
        PERFORM streamd.kg_lock(p_group_id, false);
        PERFORM streamd.kg_expire(p_group_id, p_now);
        PERFORM streamd.kg_complete(p_group_id, p_now);
        SELECT * INTO v_group FROM streamd.kafka_groups g WHERE g.group_id = p_group_id;
    END IF;
    RETURN v_group;
END;
$$;

-- The member p_member_id (or, for a static member, the holder of p_instance_id) of
-- the group, alive at p_now. Raises SD152 when p_instance_id is held by another member
-- id (this one was replaced by a restart of the instance), SD150 when there is no such
-- live member.
CREATE OR REPLACE FUNCTION streamd.kg_member(p_group_id text, p_member_id text, p_instance_id text, p_now timestamptz)
RETURNS streamd.kafka_group_members
LANGUAGE plpgsql AS $$
DECLARE
    v_member streamd.kafka_group_members%ROWTYPE;
BEGIN
    IF p_instance_id IS NOT NULL THEN
        SELECT * INTO v_member FROM streamd.kafka_group_members m
         WHERE m.group_id = p_group_id AND m.instance_id = p_instance_id;
        IF FOUND AND v_member.member_id <> p_member_id THEN
            RAISE EXCEPTION USING ERRCODE = 'SD152',
                MESSAGE = format('group %L: instance id %L is held by member %s, not %s', p_group_id, p_instance_id,
                                 v_member.member_id, p_member_id);
        END IF;
    END IF;
    SELECT * INTO v_member FROM streamd.kafka_group_members m
     WHERE m.group_id = p_group_id AND m.member_id = p_member_id
       AND m.last_heartbeat + m.session_timeout_ms * interval '1 millisecond' >= p_now;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SD150',
            MESSAGE = format('group %L has no member %L (it left, its session expired, or it never joined)',
                             p_group_id, p_member_id);
    END IF;
    IF p_instance_id IS DISTINCT FROM v_member.instance_id THEN
        RAISE EXCEPTION USING ERRCODE = 'SD152',
            MESSAGE = format('group %L: member %s has instance id %L, not %L', p_group_id, p_member_id,
                             v_member.instance_id, p_instance_id);
    END IF;
    RETURN v_member;
END;
$$;

-- JoinGroup. Adds the member (or updates a known one) and starts a rebalance when one
-- is needed: a new member, changed protocols or metadata, the leader rejoining, or a
-- member of an older generation. A follower rejoining a formed generation with the
-- same metadata just gets that generation again. Returns the member id to poll with
-- (kafka_group_join_poll) and the generation the member waits for; outcome
-- 'member_id_required' (nothing written but the group row) when the client must join
-- again with the id given (p_require_known, JoinGroup v4+, dynamic members only).
-- A static member (p_instance_id) joining with no member id replaces the member that
-- held its instance id under the new id p_new_member_id, keeping its assignment; with
-- another member's id it is fenced (SD152).
-- Raises SD103 (group id), SD105 (arguments), SD151 when the group's members use
-- another protocol type or share no protocol with this member, or when the group id
-- is a native (or KIP-848) group with live members.
CREATE OR REPLACE FUNCTION streamd.kafka_group_join(
    p_group_id             text,
    p_member_id            text,
    p_instance_id          text,
    p_new_member_id        text,
    p_require_known        boolean,
    p_client_id            text,
    p_client_host          text,
    p_session_timeout_ms   integer,
    p_rebalance_timeout_ms integer,
    p_protocol_type        text,
    p_protocol_names       text[],
    p_protocol_metadata    bytea[],
    p_topics               text[],
    p_now                  timestamptz
) RETURNS TABLE (member_id text, outcome text, wait_generation integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := coalesce(p_now, now());
    v_group  streamd.kafka_groups%ROWTYPE;
    v_member streamd.kafka_group_members%ROWTYPE;
    v_id     text;
    v_known  boolean := false;
BEGIN
    IF coalesce(p_session_timeout_ms, 0) <= 0 OR coalesce(p_rebalance_timeout_ms, 0) <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('join group %L: session timeout %s ms and rebalance timeout %s ms must be positive',
                             p_group_id, p_session_timeout_ms, p_rebalance_timeout_ms);
    END IF;
    IF coalesce(p_protocol_type, '') = '' OR coalesce(cardinality(p_protocol_names), 0) = 0
       OR cardinality(p_protocol_names) <> coalesce(cardinality(p_protocol_metadata), -1)
       OR array_position(p_protocol_names, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD151',
            MESSAGE = format('join group %L: a protocol type and at least one named protocol are required', p_group_id);
    END IF;
    IF coalesce(p_new_member_id, '') = '' OR p_member_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105', MESSAGE = format('join group %L: member ids must not be NULL', p_group_id);
    END IF;
    v_group := streamd.kg_lock(p_group_id, true);
    IF EXISTS (SELECT 1 FROM streamd.consumer_registrations cr
                WHERE cr.group_id = p_group_id
                  AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= v_now)
       OR streamd.kc_has_live_members(p_group_id, v_now) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD151',
            MESSAGE = format('group %L is a streamd (KIP-848) consumer group with live members; a classic member cannot join it',
                             p_group_id);
    END IF;
    PERFORM streamd.kg_expire(p_group_id, v_now);
    PERFORM streamd.kg_complete(p_group_id, v_now);
    SELECT * INTO v_group FROM streamd.kafka_groups g WHERE g.group_id = p_group_id;

    -- The protocol check leaves out the member itself (by id, or by instance id).
    IF EXISTS (SELECT 1 FROM streamd.kafka_group_members m
                WHERE m.group_id = p_group_id
                  AND NOT (m.member_id = p_member_id OR coalesce(m.instance_id = p_instance_id, false))) THEN
        IF v_group.protocol_type IS DISTINCT FROM p_protocol_type
           OR NOT EXISTS (SELECT 1 FROM unnest(p_protocol_names) AS c(p)
                           WHERE NOT EXISTS (SELECT 1 FROM streamd.kafka_group_members m
                                              WHERE m.group_id = p_group_id
                                                AND NOT (m.member_id = p_member_id OR coalesce(m.instance_id = p_instance_id, false))
                                                AND NOT (c.p = ANY (m.protocol_names)))) THEN
            RAISE EXCEPTION USING ERRCODE = 'SD151',
                MESSAGE = format('group %L uses protocol type %L with protocols no member of it shares with %s (%s)',
                                 p_group_id, v_group.protocol_type, p_protocol_type, array_to_string(p_protocol_names, ', '));
        END IF;
    END IF;

    IF p_instance_id IS NOT NULL THEN
        SELECT * INTO v_member FROM streamd.kafka_group_members m
         WHERE m.group_id = p_group_id AND m.instance_id = p_instance_id FOR UPDATE;
        IF FOUND THEN
            IF p_member_id <> '' AND p_member_id <> v_member.member_id THEN
                RAISE EXCEPTION USING ERRCODE = 'SD152',
                    MESSAGE = format('group %L: instance id %L is held by member %s, not %s', p_group_id, p_instance_id,
                                     v_member.member_id, p_member_id);
            END IF;
            v_known := true;
            v_id := v_member.member_id;
            IF p_member_id = '' THEN
                -- A restart of the instance: the new id takes over (the old one is fenced).
                v_id := p_new_member_id;
                UPDATE streamd.kafka_group_members m SET member_id = v_id
                 WHERE m.group_id = p_group_id AND m.member_id = v_member.member_id;
                UPDATE streamd.kafka_groups g SET leader_id = v_id
                 WHERE g.group_id = p_group_id AND g.leader_id = v_member.member_id;
                v_group.leader_id := CASE WHEN v_group.leader_id = v_member.member_id THEN v_id ELSE v_group.leader_id END;
            END IF;
        ELSE
            v_id := CASE WHEN p_member_id <> '' THEN p_member_id ELSE p_new_member_id END;
        END IF;
    ELSIF p_member_id = '' THEN
        IF p_require_known THEN
            member_id := p_new_member_id;
            outcome := 'member_id_required';
            wait_generation := v_group.generation;
            RETURN NEXT;
            RETURN;
        END IF;
        v_id := p_new_member_id;
    ELSE
        SELECT * INTO v_member FROM streamd.kafka_group_members m
         WHERE m.group_id = p_group_id AND m.member_id = p_member_id FOR UPDATE;
        v_known := FOUND;
        IF v_known AND v_member.instance_id IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'SD152',
                MESSAGE = format('group %L: member %s is the static member %L; join with that instance id',
                                 p_group_id, p_member_id, v_member.instance_id);
        END IF;
        -- An id the group does not know (the second join after member_id_required, or a
        -- member that was expired) joins as a new member.
        v_id := p_member_id;
    END IF;

    IF v_group.state = 'Empty' THEN
        UPDATE streamd.kafka_groups g SET protocol_type = p_protocol_type WHERE g.group_id = p_group_id;
    END IF;

    IF v_known THEN
        UPDATE streamd.kafka_group_members m
           SET client_id = coalesce(p_client_id, ''), client_host = coalesce(p_client_host, ''),
               session_timeout_ms = p_session_timeout_ms, rebalance_timeout_ms = p_rebalance_timeout_ms,
               protocol_type = p_protocol_type, protocol_names = p_protocol_names,
               protocol_metadata = p_protocol_metadata, topics = coalesce(p_topics, '{}'), last_heartbeat = v_now
         WHERE m.group_id = p_group_id AND m.member_id = v_id;
        IF v_group.state IN ('Stable', 'CompletingRebalance') AND v_group.leader_id <> v_id
           AND v_member.generation = v_group.generation
           AND v_member.protocol_names = p_protocol_names AND v_member.protocol_metadata = p_protocol_metadata THEN
            member_id := v_id;
            outcome := 'joined';
            wait_generation := v_group.generation;
            RETURN NEXT;
            RETURN;
        END IF;
    ELSE
        INSERT INTO streamd.kafka_group_members AS m (group_id, member_id, instance_id, client_id, client_host,
                                                      session_timeout_ms, rebalance_timeout_ms, protocol_type,
                                                      protocol_names, protocol_metadata, topics, joined, join_seq,
                                                      last_heartbeat)
        VALUES (p_group_id, v_id, p_instance_id, coalesce(p_client_id, ''), coalesce(p_client_host, ''),
                p_session_timeout_ms, p_rebalance_timeout_ms, p_protocol_type, p_protocol_names, p_protocol_metadata,
                coalesce(p_topics, '{}'), false, nextval('streamd.kafka_group_join_seq'), v_now);
    END IF;
    PERFORM streamd.kg_prepare(p_group_id, v_now);
    UPDATE streamd.kafka_group_members m SET joined = true WHERE m.group_id = p_group_id AND m.member_id = v_id;
    PERFORM streamd.kg_complete(p_group_id, v_now);
    member_id := v_id;
    outcome := 'joined';
    wait_generation := v_group.generation + 1;
    RETURN NEXT;
END;
$$;

-- A pending JoinGroup's poll: records that the member is alive, runs kg_maintain,
-- and returns outcome 'waiting' until the member belongs to a generation at least
-- p_wait_generation, then 'done' with that generation, its protocol and leader, and,
-- for the leader only, every member of it with its metadata for the chosen protocol
-- (in join order). 'unknown' when the member is no longer in the group (expired,
-- removed at the rebalance deadline, or replaced by a restart of its instance).
CREATE OR REPLACE FUNCTION streamd.kafka_group_join_poll(
    p_group_id        text,
    p_member_id       text,
    p_wait_generation integer,
    p_now             timestamptz
) RETURNS TABLE (outcome text, generation integer, protocol_type text, protocol_name text, leader_id text,
                 member_ids text[], instance_ids text[], metadata bytea[])
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, now());
    v_group streamd.kafka_groups%ROWTYPE;
    v_gen   integer;
BEGIN
    v_group := streamd.kg_maintain(p_group_id, v_now);
    UPDATE streamd.kafka_group_members m SET last_heartbeat = v_now
     WHERE m.group_id = p_group_id AND m.member_id = p_member_id
    RETURNING m.generation INTO v_gen;
    IF NOT FOUND OR v_group.group_id IS NULL THEN
        outcome := 'unknown';
        RETURN NEXT;
        RETURN;
    END IF;
    IF v_gen IS NULL OR v_gen < p_wait_generation THEN
        outcome := 'waiting';
        RETURN NEXT;
        RETURN;
    END IF;
    outcome := 'done';
    generation := v_gen;
    protocol_type := v_group.protocol_type;
    protocol_name := v_group.protocol_name;
    leader_id := v_group.leader_id;
    IF v_group.leader_id = p_member_id THEN
        SELECT array_agg(m.member_id ORDER BY m.join_seq), array_agg(m.instance_id ORDER BY m.join_seq),
               array_agg(m.protocol_metadata[array_position(m.protocol_names, v_group.protocol_name)] ORDER BY m.join_seq)
          INTO member_ids, instance_ids, metadata
          FROM streamd.kafka_group_members m
         WHERE m.group_id = p_group_id AND m.generation = v_gen;
    END IF;
    RETURN NEXT;
END;
$$;

-- SyncGroup, and its poll. Checks the member and its generation (SD150, SD152, SD153;
-- SD154 while the group is rebalancing again; SD151 when a given protocol type or name
-- is not the group's), records that the member is alive, and stores the leader's
-- assignment (p_assign_ids, p_assignments: members of the generation not named get an
-- empty one) which makes the group Stable, with the partitions each member got when
-- the wire layer decoded them (p_owned_*: member, stream, partition triples). Returns outcome 'done' with the member's
-- assignment once the group is Stable, 'waiting' before.
CREATE OR REPLACE FUNCTION streamd.kafka_group_sync(
    p_group_id      text,
    p_member_id     text,
    p_instance_id   text,
    p_generation    integer,
    p_protocol_type text,
    p_protocol_name text,
    p_assign_ids    text[],
    p_assignments   bytea[],
    p_owned_ids     text[],
    p_owned_streams text[],
    p_owned_parts   integer[],
    p_now           timestamptz
) RETURNS TABLE (outcome text, assignment bytea, protocol_type text, protocol_name text)
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := coalesce(p_now, now());
    v_group  streamd.kafka_groups%ROWTYPE;
    v_member streamd.kafka_group_members%ROWTYPE;
BEGIN
    IF cardinality(p_assign_ids) IS DISTINCT FROM cardinality(p_assignments) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('sync group %L: member ids and assignments must have the same length', p_group_id);
    END IF;
    v_group := streamd.kg_maintain(p_group_id, v_now);
    IF v_group.group_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD150', MESSAGE = format('group %L does not exist', p_group_id);
    END IF;
    IF v_group.leader_id = p_member_id AND v_group.state = 'CompletingRebalance' AND p_assign_ids IS NOT NULL THEN
        v_group := streamd.kg_lock(p_group_id, false);
    END IF;
    v_member := streamd.kg_member(p_group_id, p_member_id, p_instance_id, v_now);
    IF p_generation <> v_group.generation OR v_member.generation IS DISTINCT FROM v_group.generation THEN
        RAISE EXCEPTION USING ERRCODE = 'SD153',
            MESSAGE = format('group %L is at generation %s, not %s', p_group_id, v_group.generation, p_generation);
    END IF;
    IF v_group.state = 'PreparingRebalance' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD154', MESSAGE = format('group %L is rebalancing', p_group_id);
    END IF;
    IF (coalesce(p_protocol_type, '') <> '' AND p_protocol_type IS DISTINCT FROM v_group.protocol_type)
       OR (coalesce(p_protocol_name, '') <> '' AND p_protocol_name IS DISTINCT FROM v_group.protocol_name) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD151',
            MESSAGE = format('group %L uses protocol %L/%L, not %L/%L', p_group_id, v_group.protocol_type,
                             v_group.protocol_name, p_protocol_type, p_protocol_name);
    END IF;
    UPDATE streamd.kafka_group_members m SET last_heartbeat = v_now
     WHERE m.group_id = p_group_id AND m.member_id = p_member_id;
    IF v_group.leader_id = p_member_id AND v_group.state = 'CompletingRebalance' AND p_assign_ids IS NOT NULL THEN
        UPDATE streamd.kafka_group_members m
           SET assignment = coalesce((SELECT u.a FROM unnest(p_assign_ids, p_assignments) AS u(id, a)
                                       WHERE u.id = m.member_id LIMIT 1), '\x'::bytea)
         WHERE m.group_id = p_group_id AND m.generation = v_group.generation;
        UPDATE streamd.kafka_groups g SET state = 'Stable', updated_at = v_now WHERE g.group_id = p_group_id;
        v_group.state := 'Stable';
        -- The decoded assignment, for consumer_group_status: the group becomes a group
        -- of each stream it consumes, as a native group would.
        DELETE FROM streamd.kafka_group_assignments a WHERE a.group_id = p_group_id;
        INSERT INTO streamd.consumer_groups (stream_name, group_id)
        SELECT DISTINCT s.stream_name, p_group_id
          FROM unnest(p_owned_streams) AS u(s) JOIN streamd.streams s ON s.stream_name = u.s
         ORDER BY 1
        ON CONFLICT DO NOTHING;
        INSERT INTO streamd.kafka_group_assignments (stream_name, group_id, partition, member_id)
        SELECT u.s, p_group_id, u.p, u.m
          FROM unnest(p_owned_ids, p_owned_streams, p_owned_parts) AS u(m, s, p)
          JOIN streamd.kafka_group_members m ON m.group_id = p_group_id AND m.member_id = u.m
                                            AND m.generation = v_group.generation
          JOIN streamd.stream_partitions h ON h.stream_name = u.s AND h.partition = u.p
         ORDER BY u.s, u.p
        ON CONFLICT DO NOTHING;
    END IF;
    protocol_type := v_group.protocol_type;
    protocol_name := v_group.protocol_name;
    IF v_group.state = 'Stable' THEN
        outcome := 'done';
        SELECT coalesce(m.assignment, '\x'::bytea) INTO assignment FROM streamd.kafka_group_members m
         WHERE m.group_id = p_group_id AND m.member_id = p_member_id;
    ELSE
        outcome := 'waiting';
    END IF;
    RETURN NEXT;
END;
$$;

-- Heartbeat: records that the member is alive. Raises SD150/SD152 for a member the
-- group does not know (any more). Returns 'ok', 'illegal_generation' (another
-- generation) or 'rebalance_in_progress' (the member must rejoin): returned, not
-- raised, because the heartbeat counts all the same.
CREATE OR REPLACE FUNCTION streamd.kafka_group_heartbeat(
    p_group_id    text,
    p_member_id   text,
    p_instance_id text,
    p_generation  integer,
    p_now         timestamptz
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := coalesce(p_now, now());
    v_group  streamd.kafka_groups%ROWTYPE;
BEGIN
    v_group := streamd.kg_maintain(p_group_id, v_now);
    IF v_group.group_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD150', MESSAGE = format('group %L does not exist', p_group_id);
    END IF;
    PERFORM streamd.kg_member(p_group_id, p_member_id, p_instance_id, v_now);
    UPDATE streamd.kafka_group_members m SET last_heartbeat = v_now
     WHERE m.group_id = p_group_id AND m.member_id = p_member_id;
    IF p_generation <> v_group.generation THEN
        RETURN 'illegal_generation';
    END IF;
    IF v_group.state = 'PreparingRebalance' THEN
        RETURN 'rebalance_in_progress';
    END IF;
    RETURN 'ok';
END;
$$;

-- LeaveGroup: removes each member named by id or, for static members, by instance id
-- (then a member id, when given, must match: else 'fenced_instance'), and starts a
-- rebalance for those left (or empties the group). Returns one outcome per entry: 'ok',
-- 'unknown_member' or 'fenced_instance'.
CREATE OR REPLACE FUNCTION streamd.kafka_group_leave(
    p_group_id     text,
    p_member_ids   text[],
    p_instance_ids text[],
    p_now          timestamptz
) RETURNS TABLE (member_id text, instance_id text, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    v_group   streamd.kafka_groups%ROWTYPE;
    v_held    text;
    v_removed integer := 0;
    r         record;
BEGIN
    IF cardinality(p_member_ids) IS DISTINCT FROM cardinality(p_instance_ids) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('leave group %L: member ids and instance ids must have the same length', p_group_id);
    END IF;
    v_group := streamd.kg_lock(p_group_id, false);
    FOR r IN SELECT u.m, u.i FROM unnest(p_member_ids, p_instance_ids) AS u(m, i) LOOP
        member_id := r.m;
        instance_id := r.i;
        v_held := NULL;
        IF v_group.group_id IS NOT NULL AND r.i IS NOT NULL THEN
            SELECT m.member_id INTO v_held FROM streamd.kafka_group_members m
             WHERE m.group_id = p_group_id AND m.instance_id = r.i;
            IF v_held IS NOT NULL AND coalesce(r.m, '') NOT IN ('', v_held) THEN
                outcome := 'fenced_instance';
                RETURN NEXT;
                CONTINUE;
            END IF;
        ELSIF v_group.group_id IS NOT NULL THEN
            SELECT m.member_id INTO v_held FROM streamd.kafka_group_members m
             WHERE m.group_id = p_group_id AND m.member_id = r.m AND m.instance_id IS NULL;
        END IF;
        IF v_held IS NULL THEN
            outcome := 'unknown_member';
        ELSE
            DELETE FROM streamd.kafka_group_members m WHERE m.group_id = p_group_id AND m.member_id = v_held;
            v_removed := v_removed + 1;
            outcome := 'ok';
        END IF;
        RETURN NEXT;
    END LOOP;
    IF v_removed > 0 THEN
        PERFORM streamd.kg_prepare(p_group_id, v_now);
        PERFORM streamd.kg_complete(p_group_id, v_now);
    END IF;
END;
$$;

-- Writes one committed offset (and makes the group a group of the stream).
CREATE OR REPLACE FUNCTION streamd.kg_write_offset(p_stream_name text, p_group_id text, p_partition integer, p_offset bigint,
                                                   p_member_id text, p_epoch bigint, p_metadata text, p_now timestamptz)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO streamd.consumer_groups (stream_name, group_id) VALUES (p_stream_name, p_group_id) ON CONFLICT DO NOTHING;
    INSERT INTO streamd.consumer_offsets AS co (stream_name, group_id, partition, "offset", committed_by, member_epoch, metadata, updated_at)
    VALUES (p_stream_name, p_group_id, p_partition, p_offset, p_member_id, p_epoch, p_metadata, p_now)
    ON CONFLICT (stream_name, group_id, partition) DO UPDATE
       SET "offset" = EXCLUDED."offset", committed_by = EXCLUDED.committed_by, member_epoch = EXCLUDED.member_epoch,
           metadata = EXCLUDED.metadata, updated_at = EXCLUDED.updated_at;
$$;

-- OffsetCommit. For a classic group, fenced by the generation as Kafka does: a
-- member's commit needs the group's current generation (SD153), a live member
-- (SD150/SD152), and no rebalance between JoinGroup and SyncGroup (SD154); commits
-- during PreparingRebalance are accepted (members commit while they revoke). The group
-- row is locked FOR SHARE while the offsets are written, so a new generation cannot
-- form while a commit of the old one is in flight. A commit with no member id and a
-- negative generation (an admin or a consumer without a group) is accepted when the
-- group has no members.
-- A member id with a generation but no classic group is a streamd (KIP-848) member,
-- p_generation its member epoch: each partition is fenced as commit_offsets fences
-- (the ownership row FOR KEY SHARE where the member owns it at that epoch, G1). For a
-- KIP-848 member of kafka_consumer_members (0225), p_generation is its Kafka epoch,
-- checked against that row, and the partition is fenced at the native epoch of the
-- member's membership of the stream.
-- The offsets are the rows of streamd.consumer_offsets (per stream, group, partition),
-- the ones native groups use. Returns one outcome per entry (by its position in the
-- arrays, from 1): 'ok', 'unknown_partition', 'offset_out_of_range' (outside [0, log
-- end]), 'unknown_member' (not a live member of the stream's group; or, for a classic
-- or admin commit, the stream's native group has live members), 'fenced_epoch' (the
-- member's epoch is another one) or 'stale_epoch' (it does not own the partition at
-- that epoch).
CREATE OR REPLACE FUNCTION streamd.kafka_group_commit(
    p_group_id    text,
    p_member_id   text,
    p_instance_id text,
    p_generation  integer,
    p_streams     text[],
    p_partitions  integer[],
    p_offsets     bigint[],
    p_metadata    text[],
    p_now         timestamptz
) RETURNS TABLE (entry integer, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    v_now       timestamptz := coalesce(p_now, now());
    v_group     streamd.kafka_groups%ROWTYPE;
    v_member_id text := nullif(p_member_id, '');
    v_found     boolean;
    v_native    boolean;
    v_epoch     bigint;
    v_kmember   streamd.kafka_consumer_members%ROWTYPE;
    v_k848      boolean := false;
    r           record;
BEGIN
    IF NOT streamd.cg_valid_group_id(p_group_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD103',
            MESSAGE = format('invalid group id %L: use 1 to 249 characters of A-Z a-z 0-9 . _ : -', p_group_id);
    END IF;
    IF cardinality(p_streams) IS DISTINCT FROM cardinality(p_partitions)
       OR cardinality(p_streams) IS DISTINCT FROM cardinality(p_offsets)
       OR cardinality(p_streams) IS DISTINCT FROM cardinality(p_metadata) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('commit offsets of group %L: streams, partitions, offsets and metadata must have the same length',
                             p_group_id);
    END IF;
    SELECT * INTO v_group FROM streamd.kafka_groups g WHERE g.group_id = p_group_id FOR SHARE;
    v_found := FOUND;
    v_native := NOT v_found AND p_generation >= 0 AND v_member_id IS NOT NULL;
    IF v_found AND (p_generation >= 0 OR v_member_id IS NOT NULL OR v_group.state <> 'Empty') THEN
        -- Kafka's order: the member, its generation, then the state.
        PERFORM streamd.kg_member(p_group_id, coalesce(v_member_id, ''), p_instance_id, v_now);
        IF p_generation <> v_group.generation THEN
            RAISE EXCEPTION USING ERRCODE = 'SD153',
                MESSAGE = format('group %L is at generation %s, not %s', p_group_id, v_group.generation, p_generation);
        END IF;
        IF v_group.state = 'CompletingRebalance' THEN
            RAISE EXCEPTION USING ERRCODE = 'SD154',
                MESSAGE = format('group %L is between JoinGroup and SyncGroup of generation %s', p_group_id, v_group.generation);
        END IF;
    ELSIF NOT v_found AND p_generation >= 0 AND NOT v_native THEN
        RAISE EXCEPTION USING ERRCODE = 'SD153',
            MESSAGE = format('group %L has no generation %s (it has no classic members)', p_group_id, p_generation);
    END IF;
    IF v_native THEN
        -- A KIP-848 member (0225_kafka_consumer_members.sql): p_generation is its Kafka
        -- member epoch, checked here; each partition is then fenced at the native
        -- epoch of the member's membership of that stream. FOR SHARE: a join that
        -- gives the member a new epoch waits for this commit, and later commits with
        -- the old epoch find the new one.
        SELECT * INTO v_kmember FROM streamd.kafka_consumer_members m
         WHERE m.group_id = p_group_id AND m.member_id = v_member_id FOR SHARE;
        v_k848 := FOUND;
    END IF;

    FOR r IN SELECT u.s, u.p, u.o, u.m, u.i, h.next_offset
               FROM unnest(p_streams, p_partitions, p_offsets, p_metadata) WITH ORDINALITY AS u(s, p, o, m, i)
               LEFT JOIN streamd.stream_partitions h ON h.stream_name = u.s AND h.partition = u.p
              ORDER BY u.s, u.p, u.i LOOP
        entry := r.i;
        IF r.next_offset IS NULL THEN
            outcome := 'unknown_partition';
        ELSIF r.o IS NULL OR r.o < 0 OR r.o > r.next_offset THEN
            outcome := 'offset_out_of_range';
        ELSIF v_k848 AND v_kmember.last_heartbeat + v_kmember.session_timeout_ms * interval '1 millisecond' < v_now THEN
            outcome := 'unknown_member';
        ELSIF v_k848 AND v_kmember.member_epoch <> p_generation THEN
            outcome := 'fenced_epoch';
        ELSIF v_k848 THEN
            SELECT cr.member_epoch INTO v_epoch FROM streamd.consumer_registrations cr
             WHERE cr.stream_name = r.s AND cr.group_id = p_group_id AND cr.consumer_id = v_member_id
               AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= v_now;
            -- The same fence as below, at the native epoch; a stream the member does
            -- not consume (now) is a partition it does not own at its epoch.
            PERFORM 1 FROM streamd.consumer_partitions cp
             WHERE cp.stream_name = r.s AND cp.group_id = p_group_id AND cp.partition = r.p
               AND cp.owner_id = v_member_id AND cp.owner_epoch = v_epoch
               FOR KEY SHARE OF cp;
            IF v_epoch IS NULL OR NOT FOUND THEN
                outcome := 'stale_epoch';
            ELSE
                PERFORM streamd.kg_write_offset(r.s, p_group_id, r.p, r.o, v_member_id, v_epoch, r.m, v_now);
                outcome := 'ok';
            END IF;
        ELSIF v_native THEN
            -- No KIP-848 member row: the member left, lapsed or was replaced (a static
            -- member's restart deletes the old row at once, while its native
            -- memberships of streams the new member does not take over live on until
            -- their sessions end). Its Kafka epoch is no native epoch, so it is not
            -- compared with one (both counters start at 1): unknown member, and the
            -- client joins again.
            outcome := 'unknown_member';
        ELSIF streamd.cg_has_live_members(r.s, p_group_id, v_now) THEN
            outcome := 'unknown_member';
        ELSE
            PERFORM streamd.kg_write_offset(r.s, p_group_id, r.p, r.o, v_member_id,
                                            CASE WHEN p_generation >= 0 THEN p_generation END, r.m, v_now);
            outcome := 'ok';
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- DeleteGroups for one group id: the classic group, the group of that id on every
-- stream (their committed offsets go with them) and its KIP-848 epoch counter. Raises SD104 when the group has live
-- members (classic or native), SD103 for an invalid id; returns false when there is no
-- group of that id at all.
CREATE OR REPLACE FUNCTION streamd.kafka_group_delete(p_group_id text, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, now());
    v_group streamd.kafka_groups%ROWTYPE;
    v_found boolean;
    r       record;
BEGIN
    v_group := streamd.kg_lock(p_group_id, false);
    v_found := v_group.group_id IS NOT NULL;
    IF v_found THEN
        PERFORM streamd.kg_expire(p_group_id, v_now);
        PERFORM streamd.kg_complete(p_group_id, v_now);
        IF EXISTS (SELECT 1 FROM streamd.kafka_group_members m WHERE m.group_id = p_group_id) THEN
            RAISE EXCEPTION USING ERRCODE = 'SD104',
                MESSAGE = format('group %L has live members; stop them first', p_group_id);
        END IF;
    END IF;
    IF streamd.kc_has_live_members(p_group_id, v_now) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD104',
            MESSAGE = format('group %L has live KIP-848 members; stop them first', p_group_id);
    END IF;
    FOR r IN SELECT g.stream_name FROM streamd.consumer_groups g WHERE g.group_id = p_group_id ORDER BY 1 LOOP
        -- Raises SD104 when that stream's group has live members.
        v_found := streamd.delete_group(r.stream_name, p_group_id, false, v_now) OR v_found;
    END LOOP;
    DELETE FROM streamd.kafka_groups g WHERE g.group_id = p_group_id;
    -- A KIP-848 group that never consumed a stream is a group too (ListGroups lists it).
    DELETE FROM streamd.kafka_consumer_groups g WHERE g.group_id = p_group_id;
    v_found := FOUND OR v_found;
    RETURN v_found;
END;
$$;

-- OffsetDelete: deletes the group's committed offsets of the given partitions, except
-- on streams the group consumes now (a live classic member subscribed to it, or live
-- native members): 'subscribed' (Kafka's GROUP_SUBSCRIBED_TO_TOPIC). Returns one
-- outcome per entry (by position, from 1): 'ok' (also when nothing was committed), 'subscribed' or
-- 'unknown_partition'. Raises SD102 when there is no group of that id.
CREATE OR REPLACE FUNCTION streamd.kafka_group_offset_delete(
    p_group_id   text,
    p_streams    text[],
    p_partitions integer[],
    p_now        timestamptz
) RETURNS TABLE (entry integer, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, now());
    v_group streamd.kafka_groups%ROWTYPE;
    r       record;
BEGIN
    IF cardinality(p_streams) IS DISTINCT FROM cardinality(p_partitions) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('delete offsets of group %L: streams and partitions must have the same length', p_group_id);
    END IF;
    v_group := streamd.kg_lock(p_group_id, false);
    IF v_group.group_id IS NULL AND NOT EXISTS (SELECT 1 FROM streamd.consumer_groups g WHERE g.group_id = p_group_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD102', MESSAGE = format('group %L does not exist', p_group_id);
    END IF;
    IF v_group.group_id IS NOT NULL THEN
        PERFORM streamd.kg_expire(p_group_id, v_now);
        PERFORM streamd.kg_complete(p_group_id, v_now);
    END IF;
    FOR r IN SELECT u.s, u.p, u.i, h.partition AS known
               FROM unnest(p_streams, p_partitions) WITH ORDINALITY AS u(s, p, i)
               LEFT JOIN streamd.stream_partitions h ON h.stream_name = u.s AND h.partition = u.p
              ORDER BY u.s, u.p, u.i LOOP
        entry := r.i;
        IF r.known IS NULL THEN
            outcome := 'unknown_partition';
        ELSIF streamd.cg_has_live_members(r.s, p_group_id, v_now)
              OR EXISTS (SELECT 1 FROM streamd.kafka_group_members m
                          WHERE m.group_id = p_group_id AND r.s = ANY (m.topics)) THEN
            outcome := 'subscribed';
        ELSE
            DELETE FROM streamd.consumer_offsets co
             WHERE co.stream_name = r.s AND co.group_id = p_group_id AND co.partition = r.p;
            outcome := 'ok';
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Runs kg_maintain on every group that has a dead member or a due rebalance, so that
-- listing and describing report Kafka's state without a timer (a group whose members
-- all died is Empty, not Stable). Returns how many groups it touched. It touches
-- every group, so it never takes a time later than the database's: a caller whose
-- clock runs ahead must not expire other groups' live members.
CREATE OR REPLACE FUNCTION streamd.kafka_groups_maintain(p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := least(coalesce(p_now, now()), now());
    v_n   integer := 0;
    r     record;
BEGIN
    FOR r IN SELECT g.group_id FROM streamd.kafka_groups g
              WHERE EXISTS (SELECT 1 FROM streamd.kafka_group_members m
                             WHERE m.group_id = g.group_id
                               AND m.last_heartbeat + m.session_timeout_ms * interval '1 millisecond' < v_now)
                 OR (g.state = 'PreparingRebalance' AND g.rebalance_deadline < v_now)
              ORDER BY g.group_id LOOP
        PERFORM streamd.kg_maintain(r.group_id, v_now);
        v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
END;
$$;
