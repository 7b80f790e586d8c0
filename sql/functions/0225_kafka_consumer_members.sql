-- KIP-848 members at the level of the Kafka group (tables: migration 0105). A member
-- has one Kafka member epoch for its subscription (topic names and/or a regex); it
-- consumes each subscribed stream through a native membership of that stream's group
-- (join_group, group_heartbeat, ... of 0200_consumer_groups.sql, called by
-- consumergroup/kip848.go under the member's id), whose native epoch fences its
-- partitions there. kafka_group_commit (0220_kafka_groups.sql) checks the Kafka epoch
-- here and the partition at the native epoch.

-- The KIP-848 members of a group whose session is live at p_now.
CREATE OR REPLACE FUNCTION streamd.kc_has_live_members(p_group_id text, p_now timestamptz)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM streamd.kafka_consumer_members m
                    WHERE m.group_id = p_group_id
                      AND m.last_heartbeat + m.session_timeout_ms * interval '1 millisecond' >= p_now)
$$;

-- Joins (or joins again) a KIP-848 member: a new member epoch, the next of the group's
-- counter, and the subscription. A member holding the same instance id is replaced
-- (its row goes; its native memberships are taken over stream by stream by join_group).
-- Members of the group whose session lapsed are removed. A Kafka classic group of the
-- id whose members all left or expired (Empty) becomes a consumer group, as Kafka
-- converts it at the first ConsumerGroupHeartbeat: its row goes in this transaction
-- (its committed offsets are consumer_offsets rows and stay), so the member's commits
-- are not taken for classic ones. Raises SD103 for an invalid group id, SD105 for an
-- invalid member id or timeouts, SD151 when the group id has live Kafka classic
-- members. Returns the member epoch.
--
-- Lock order: the kafka_groups row (as kafka_group_delete and kafka_group_commit take
-- it first), then the kafka_consumer_groups counter row, then member rows.
CREATE OR REPLACE FUNCTION streamd.kafka_consumer_join(
    p_group_id             text,
    p_member_id            text,
    p_instance_id          text,
    p_topics               text[],
    p_regex                text,
    p_session_timeout_ms   integer,
    p_rebalance_timeout_ms integer,
    p_now                  timestamptz
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz;
    v_epoch   integer;
    v_classic streamd.kafka_groups%ROWTYPE;
BEGIN
    IF NOT streamd.cg_valid_group_id(p_group_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD103',
            MESSAGE = format('invalid group id %L: use 1 to 249 characters of A-Z a-z 0-9 . _ : -', p_group_id);
    END IF;
    IF p_member_id IS NULL OR length(p_member_id) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105', MESSAGE = format('invalid member id %L: use 1 to 255 characters', p_member_id);
    END IF;
    IF coalesce(p_session_timeout_ms, 0) <= 0 OR coalesce(p_rebalance_timeout_ms, 0) <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('session timeout %s ms and rebalance timeout %s ms must be positive', p_session_timeout_ms, p_rebalance_timeout_ms);
    END IF;
    v_classic := streamd.kg_lock(p_group_id, false);
    -- The group's counter row serializes the joins of the group.
    INSERT INTO streamd.kafka_consumer_groups AS g (group_id, group_epoch, updated_at)
    VALUES (p_group_id, 1, coalesce(p_now, clock_timestamp()))
    ON CONFLICT (group_id) DO UPDATE SET group_epoch = g.group_epoch + 1, updated_at = EXCLUDED.updated_at
    RETURNING g.group_epoch INTO v_epoch;
    -- After the locks (the clock rule, as join_group).
    v_now := coalesce(p_now, clock_timestamp());
    IF v_classic.group_id IS NOT NULL THEN
        PERFORM streamd.kg_expire(p_group_id, v_now);
        PERFORM streamd.kg_complete(p_group_id, v_now);
        IF EXISTS (SELECT 1 FROM streamd.kafka_group_members km WHERE km.group_id = p_group_id) THEN
            RAISE EXCEPTION USING ERRCODE = 'SD151',
                MESSAGE = format('group %L is a Kafka classic group with live members; a KIP-848 member cannot join it', p_group_id);
        END IF;
        DELETE FROM streamd.kafka_group_assignments a WHERE a.group_id = p_group_id;
        DELETE FROM streamd.kafka_groups g WHERE g.group_id = p_group_id;
    END IF;
    DELETE FROM streamd.kafka_consumer_members m
     WHERE m.group_id = p_group_id AND m.member_id <> p_member_id
       AND (m.last_heartbeat + m.session_timeout_ms * interval '1 millisecond' < v_now
            OR (p_instance_id IS NOT NULL AND m.instance_id = p_instance_id));
    INSERT INTO streamd.kafka_consumer_members AS m (group_id, member_id, member_epoch, instance_id, subscribed_topics,
                                                     subscribed_regex, session_timeout_ms, rebalance_timeout_ms,
                                                     joined_at, last_heartbeat)
    VALUES (p_group_id, p_member_id, v_epoch, p_instance_id, coalesce(p_topics, '{}'), nullif(p_regex, ''),
            p_session_timeout_ms, p_rebalance_timeout_ms, v_now, v_now)
    ON CONFLICT (group_id, member_id) DO UPDATE
       SET member_epoch = EXCLUDED.member_epoch, instance_id = EXCLUDED.instance_id,
           subscribed_topics = EXCLUDED.subscribed_topics, subscribed_regex = EXCLUDED.subscribed_regex,
           session_timeout_ms = EXCLUDED.session_timeout_ms, rebalance_timeout_ms = EXCLUDED.rebalance_timeout_ms,
           joined_at = EXCLUDED.joined_at, last_heartbeat = EXCLUDED.last_heartbeat, virtual_topics = '{}';
    RETURN v_epoch;
END;
$$;

-- A KIP-848 member's heartbeat: renews its session and, when p_topics or p_regex is
-- not NULL, changes its subscription (an empty regex removes it). Raises SD150 when
-- the member is unknown or its session lapsed (it joins again), SD110 when its epoch is
-- another one. Returns the subscription, the member's instance id, rebalance timeout
-- and virtual topics (kafka_consumer_set_virtual).
CREATE OR REPLACE FUNCTION streamd.kafka_consumer_heartbeat(
    p_group_id     text,
    p_member_id    text,
    p_member_epoch integer,
    p_topics       text[],
    p_regex        text,
    p_now          timestamptz
) RETURNS TABLE (subscribed_topics text[], subscribed_regex text, instance_id text, rebalance_timeout_ms integer,
                 virtual_topics text[])
LANGUAGE plpgsql AS $$
DECLARE
    v_member streamd.kafka_consumer_members%ROWTYPE;
    v_now    timestamptz;
BEGIN
    SELECT * INTO v_member FROM streamd.kafka_consumer_members m
     WHERE m.group_id = p_group_id AND m.member_id = p_member_id FOR UPDATE;
    v_now := coalesce(p_now, clock_timestamp());
    IF NOT FOUND OR v_member.last_heartbeat + v_member.session_timeout_ms * interval '1 millisecond' < v_now THEN
        RAISE EXCEPTION USING ERRCODE = 'SD150',
            MESSAGE = format('%L is not a live KIP-848 member of group %L', p_member_id, p_group_id);
    END IF;
    IF v_member.member_epoch <> p_member_epoch THEN
        RAISE EXCEPTION USING ERRCODE = 'SD110',
            MESSAGE = format('member %L of group %L is at epoch %s, not %s', p_member_id, p_group_id,
                             v_member.member_epoch, p_member_epoch);
    END IF;
    UPDATE streamd.kafka_consumer_members m
       SET last_heartbeat = v_now,
           subscribed_topics = coalesce(p_topics, m.subscribed_topics),
           subscribed_regex = CASE WHEN p_regex IS NULL THEN m.subscribed_regex ELSE nullif(p_regex, '') END
     WHERE m.group_id = p_group_id AND m.member_id = p_member_id
    RETURNING m.subscribed_topics, m.subscribed_regex, m.instance_id, m.rebalance_timeout_ms, m.virtual_topics
         INTO subscribed_topics, subscribed_regex, instance_id, rebalance_timeout_ms, virtual_topics;
    RETURN NEXT;
END;
$$;

-- Removes a KIP-848 member (its native memberships are left by the caller first).
-- Returns false when it was not a member.
CREATE OR REPLACE FUNCTION streamd.kafka_consumer_leave(p_group_id text, p_member_id text)
RETURNS boolean
LANGUAGE sql AS $$
    WITH d AS (DELETE FROM streamd.kafka_consumer_members m
                WHERE m.group_id = p_group_id AND m.member_id = p_member_id RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM d)
$$;

-- Records the virtual topics a member's subscription takes in (the caller resolves
-- them: its regex is RE2, which SQL does not speak). Returns false when the member is
-- not at that epoch (nothing written).
CREATE OR REPLACE FUNCTION streamd.kafka_consumer_set_virtual(p_group_id text, p_member_id text, p_member_epoch integer,
                                                              p_topics text[])
RETURNS boolean
LANGUAGE sql AS $$
    WITH u AS (UPDATE streamd.kafka_consumer_members m SET virtual_topics = coalesce(p_topics, '{}')
                WHERE m.group_id = p_group_id AND m.member_id = p_member_id AND m.member_epoch = p_member_epoch
               RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM u)
$$;

-- A member's share of virtual topics: for each topic, whether the member is among the
-- live members whose virtual_topics hold it, how many of those sort before p_member_id
-- (byte order, as Go sorts) and how many there are. The member takes partition i of a
-- topic when i mod n is its rank.
CREATE OR REPLACE FUNCTION streamd.kafka_consumer_virtual_ranks(p_group_id text, p_member_id text, p_topics text[],
                                                                p_now timestamptz)
RETURNS TABLE (topic text, taker boolean, rank integer, takers integer)
LANGUAGE sql STABLE AS $$
    SELECT v.t, coalesce(bool_or(m.member_id = p_member_id), false),
           (count(m.member_id) FILTER (WHERE m.member_id COLLATE "C" < p_member_id COLLATE "C"))::integer,
           count(m.member_id)::integer
      FROM unnest(p_topics) AS v(t)
      LEFT JOIN streamd.kafka_consumer_members m
        ON m.group_id = p_group_id AND v.t = ANY (m.virtual_topics)
       AND m.last_heartbeat + m.session_timeout_ms * interval '1 millisecond' >= coalesce(p_now, now())
     GROUP BY v.t
     ORDER BY v.t
$$;

-- Bumps stream_set_version in the transaction that creates or deletes a stream (the
-- deferred trigger of migration 0135, which created it first).
CREATE OR REPLACE FUNCTION streamd.stream_set_changed()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE streamd.stream_set_version SET version = version + 1;
    RETURN NULL;
END;
$$;
