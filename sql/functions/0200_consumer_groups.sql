-- Consumer group coordination: membership, the sticky balanced assignor, handover,
-- fenced offset commits, and group administration. Applied idempotently on every
-- migrate. The Go side is package consumergroup; its errors.go maps these SQLSTATEs:
--   SD101 fenced (not a member at that epoch, or not the owner), which cg_raise_fenced
--         narrows to SD108 session expired, SD109 partition moved or SD110 stale epoch
--   SD102 group not found          SD103 invalid group id
--   SD104 group has live members   SD105 invalid argument
--   SD106 dead letter not found    SD107 batch already committed
--
-- Lock order, everywhere: the consumer_groups row, then consumer_registrations rows,
-- then consumer_partitions rows in ascending partition order. Commits lock only
-- partition rows (FOR KEY SHARE, ascending), so they never deadlock with a rebalance,
-- and the fence is checked and the offset written in one transaction. FOR KEY SHARE,
-- not FOR SHARE: a handler's transaction may stay open after its CommitTx (up to
-- MaxPollInterval), and FOR SHARE conflicts with every UPDATE of the row, so setting a
-- pending target (cg_assign) or pausing waited for it while holding the group row, and
-- the whole group stalled. FOR KEY SHARE conflicts only with FOR UPDATE and DELETE: so
-- every change of a partition's owner first locks the row FOR UPDATE (cg_drop_member,
-- release_partitions, the static join; expiry and admin resets go through
-- cg_drop_member; delete_group deletes), and a handover waits for an in-flight commit
-- or makes it find nothing (G1).
-- A member that goes away while its commit is in flight (its session expires, it
-- leaves, a restart takes its instance id) must not make the group wait for that
-- transaction: a handler frozen after its CommitTx (a GC pause, a stopped VM, a
-- connection that never comes back) held the ownership row, and the expiring heartbeat
-- waited for it FOR UPDATE while holding the group row, so every other heartbeat and
-- join queued behind it and the healthy members were expelled. So expiry, leave and the
-- static join lock the departing member's ownership rows FOR UPDATE SKIP LOCKED and hand
-- over only those; a row locked by an in-flight commit stays the departed member's (an
-- orphan: its owner has no registration at that epoch, so nothing new of it passes the
-- fence) until that transaction ends, and the next expiry pass (any heartbeat, join or
-- the reaper) moves it with the same SKIP LOCKED lock (cg_move_orphans). The move still
-- happens only under FOR UPDATE, after the commit ended (G1, G4). The in-flight
-- transaction itself is refused at its COMMIT (SD108) by the deferred check on
-- consumer_offsets (cg_offsets_check_session), since its member is gone.
-- Release, forced offset reset and group deletion still wait (FOR UPDATE, DELETE): a
-- release is the owner's own handover after its batch, and the admin operations must
-- not pass a commit.
--
-- Time (DESIGN.md, the clock rule): a time these functions store or compare with a
-- session is coalesce(p_now, clock_timestamp()) read after the group lock (and the
-- member's own row lock) the function may wait for, never now(): now() is the start
-- of the caller's transaction, so a join that waited for the group row registered a
-- member already expired, and a CommitTx judged its session by the time its
-- handler's transaction began. A heartbeat's own session is judged at its arrival
-- (statement_timestamp()): waiting for the group row is the server's doing.
--
-- Group operations lock the group row FOR NO KEY UPDATE, not FOR UPDATE: a commit's
-- first offset row takes FOR KEY SHARE on it (its foreign key check), which FOR UPDATE
-- conflicts with; a handler's transaction kept open after its CommitTx then blocked
-- every join, heartbeat and release of the group, and a rebalance racing such a
-- commit could deadlock. Only delete_group, which deletes the row, takes FOR UPDATE.

-- The LISTEN/NOTIFY channel of a group: a fixed-length identifier whatever the names.
CREATE OR REPLACE FUNCTION streamd.cg_channel(p_stream_name text, p_group_id text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT 'streamd_group_' || md5(p_stream_name || '/' || p_group_id)
$$;

-- A group id: 1 to 249 characters of [A-Za-z0-9._:-] (stream names' rule, plus ':').
CREATE OR REPLACE FUNCTION streamd.cg_valid_group_id(p_group_id text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_group_id IS NOT NULL AND p_group_id ~ '^[A-Za-z0-9._:-]{1,249}$' AND p_group_id NOT IN ('.', '..')
$$;

-- Locks the group row; creates the group first when p_create. Raises SD001/SD003 for a
-- missing or invalid stream, SD103 for an invalid group id, SD102 for a missing group.
CREATE OR REPLACE FUNCTION streamd.cg_lock_group(p_stream_name text, p_group_id text, p_create boolean)
RETURNS streamd.consumer_groups
LANGUAGE plpgsql AS $$
DECLARE
    v_group streamd.consumer_groups%ROWTYPE;
BEGIN
    IF NOT streamd.cg_valid_group_id(p_group_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD103',
            MESSAGE = format('invalid group id %L: use 1 to 249 characters of A-Z a-z 0-9 . _ : -', p_group_id);
    END IF;
    IF p_create THEN
        PERFORM 1 FROM streamd.streams s WHERE s.stream_name = p_stream_name;
        IF NOT FOUND THEN
            PERFORM streamd.raise_partition_missing(p_stream_name, 0);
        END IF;
        INSERT INTO streamd.consumer_groups (stream_name, group_id) VALUES (p_stream_name, p_group_id)
        ON CONFLICT DO NOTHING;
    END IF;
    SELECT * INTO v_group FROM streamd.consumer_groups g
     WHERE g.stream_name = p_stream_name AND g.group_id = p_group_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SD102',
            MESSAGE = format('group %L of stream %L does not exist', p_group_id, p_stream_name);
    END IF;
    RETURN v_group;
END;
$$;

-- Removes a member: each partition it owns goes to its pending target (the target has
-- waited for exactly this) or becomes unowned; pending moves to it are cancelled.
-- The caller holds the group lock and runs cg_assign afterwards. The partitions it
-- owns are locked FOR UPDATE first, which conflicts with their in-flight commits
-- (their FOR KEY SHARE); those only promised to it are not: clearing a target is no
-- handover. p_wait: wait for those commits (a forced reset). Otherwise (expiry,
-- leave) a partition whose row an in-flight commit holds is skipped: it stays the
-- removed member's, an orphan, until that transaction ends and cg_move_orphans moves
-- it, so the caller, holding the group row, never waits for a member's transaction.
CREATE OR REPLACE FUNCTION streamd.cg_drop_member(p_stream_name text, p_group_id text, p_consumer_id text, p_now timestamptz,
                                                  p_wait boolean)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_locked integer[];
BEGIN
    IF p_wait THEN
        SELECT coalesce(array_agg(x.partition), '{}') INTO v_locked FROM (
            SELECT cp.partition FROM streamd.consumer_partitions cp
             WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.owner_id = p_consumer_id
             ORDER BY cp.partition FOR UPDATE) x;
    ELSE
        SELECT coalesce(array_agg(x.partition), '{}') INTO v_locked FROM (
            SELECT cp.partition FROM streamd.consumer_partitions cp
             WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.owner_id = p_consumer_id
             ORDER BY cp.partition FOR UPDATE SKIP LOCKED) x;
    END IF;
    UPDATE streamd.consumer_partitions cp
       SET owner_id = cp.target_id,
           owner_epoch = (SELECT r.member_epoch FROM streamd.consumer_registrations r
                           WHERE r.stream_name = p_stream_name AND r.group_id = p_group_id AND r.consumer_id = cp.target_id),
           target_id = NULL, target_since = NULL, assigned_at = p_now
     WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.owner_id = p_consumer_id
       AND cp.partition = ANY (v_locked);
    UPDATE streamd.consumer_partitions cp SET target_id = NULL, target_since = NULL
     WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.target_id = p_consumer_id;
    DELETE FROM streamd.consumer_registrations r
     WHERE r.stream_name = p_stream_name AND r.group_id = p_group_id AND r.consumer_id = p_consumer_id;
END;
$$;

-- Moves the group's orphans: partitions whose owner has no registration at the owner
-- epoch any more (it was expired or left, or a restart took its instance id, while
-- an in-flight commit held the row). Each goes to its pending target, or becomes
-- unowned for cg_assign. FOR UPDATE SKIP LOCKED: an orphan whose commit is still in
-- flight is left for a later pass, so the caller (holding the group row) never waits
-- for it, and the move happens only after that commit ended (G1). Notifies the group
-- when it moved one (the new owner learns it at once). Returns how many it moved. The
-- caller holds the group lock.
CREATE OR REPLACE FUNCTION streamd.cg_move_orphans(p_stream_name text, p_group_id text, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_locked integer[];
BEGIN
    SELECT coalesce(array_agg(x.partition), '{}') INTO v_locked FROM (
        SELECT cp.partition FROM streamd.consumer_partitions cp
         WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.owner_id IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM streamd.consumer_registrations r
                            WHERE r.stream_name = p_stream_name AND r.group_id = p_group_id
                              AND r.consumer_id = cp.owner_id AND r.member_epoch = cp.owner_epoch)
         ORDER BY cp.partition FOR UPDATE OF cp SKIP LOCKED) x;
    IF cardinality(v_locked) = 0 THEN
        RETURN 0;
    END IF;
    UPDATE streamd.consumer_partitions cp
       SET owner_id = cp.target_id,
           owner_epoch = (SELECT r.member_epoch FROM streamd.consumer_registrations r
                           WHERE r.stream_name = p_stream_name AND r.group_id = p_group_id AND r.consumer_id = cp.target_id),
           target_id = NULL, target_since = NULL, assigned_at = p_now
     WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.partition = ANY (v_locked);
    PERFORM pg_notify(streamd.cg_channel(p_stream_name, p_group_id), 'assign');
    RETURN cardinality(v_locked);
END;
$$;

-- True when the group has an orphan (see cg_move_orphans): a heartbeat must take the
-- group lock and try to move it.
CREATE OR REPLACE FUNCTION streamd.cg_has_orphans(p_stream_name text, p_group_id text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM streamd.consumer_partitions cp
                    WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.owner_id IS NOT NULL
                      AND NOT EXISTS (SELECT 1 FROM streamd.consumer_registrations r
                                       WHERE r.stream_name = p_stream_name AND r.group_id = p_group_id
                                         AND r.consumer_id = cp.owner_id AND r.member_epoch = cp.owner_epoch))
$$;

-- Expires the group's members whose session timed out, or that kept a partition
-- promised to another member longer than their rebalance timeout, without waiting for
-- their in-flight commits (cg_drop_member), then moves the orphans whose commits
-- ended (cg_move_orphans). Returns how many members it expired. The caller holds the
-- group lock.
CREATE OR REPLACE FUNCTION streamd.cg_expire(p_stream_name text, p_group_id text, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer := 0;
    r       record;
BEGIN
    -- FOR UPDATE re-checks the condition against a concurrent heartbeat's new row.
    FOR r IN SELECT cr.consumer_id,
                    CASE WHEN cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' < p_now
                         THEN 'session_timeout' ELSE 'rebalance_timeout' END AS reason
               FROM streamd.consumer_registrations cr
              WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id
                AND (cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' < p_now
                     OR EXISTS (SELECT 1 FROM streamd.consumer_partitions cp
                                 WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id
                                   AND cp.owner_id = cr.consumer_id AND cp.target_id IS NOT NULL
                                   AND cp.target_since + cr.rebalance_timeout_ms * interval '1 millisecond' < p_now))
              ORDER BY cr.consumer_id
                FOR UPDATE LOOP
        PERFORM streamd.advise_member_gone(p_stream_name, p_group_id, r.consumer_id, r.reason, p_now);
        PERFORM streamd.cg_drop_member(p_stream_name, p_group_id, r.consumer_id, p_now, false);
        v_count := v_count + 1;
    END LOOP;
    PERFORM streamd.cg_move_orphans(p_stream_name, p_group_id, p_now);
    RETURN v_count;
END;
$$;

-- The assignor: sticky and balanced. Every member gets floor(n/m) or ceil(n/m) of the
-- n partitions; the members that hold the most now get the larger quotas, each keeps
-- as many of the partitions it holds (or is about to receive) as its quota allows, and
-- only the rest move. A partition with no owner goes to its new member at once; an
-- owned one gets a pending target and moves when its owner releases it or is expired.
-- The caller holds the group lock. Returns the number of partitions whose owner or
-- target changed, and notifies the group's channel when that is not zero.
CREATE OR REPLACE FUNCTION streamd.cg_assign(p_stream_name text, p_group_id text, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n       integer;
    v_m       integer;
    v_changed integer := 0;
    r         record;
BEGIN
    SELECT s.partitions INTO v_n FROM streamd.streams s WHERE s.stream_name = p_stream_name;
    INSERT INTO streamd.consumer_partitions (stream_name, group_id, partition)
    SELECT p_stream_name, p_group_id, g FROM generate_series(0, v_n - 1) g
    ON CONFLICT DO NOTHING;
    SELECT count(*) INTO v_m FROM streamd.consumer_registrations cr
     WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id;

    IF v_m = 0 THEN
        UPDATE streamd.consumer_partitions cp SET target_id = NULL, target_since = NULL
         WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.target_id IS NOT NULL;
        RETURN 0;
    END IF;

    FOR r IN
        WITH cur AS (
            SELECT cp.partition, cp.owner_id, cp.target_id, coalesce(cp.target_id, cp.owner_id) AS holder
              FROM streamd.consumer_partitions cp
             WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id
        ), mem AS (
            SELECT cr.consumer_id, cr.member_epoch,
                   (SELECT count(*) FROM cur WHERE cur.holder = cr.consumer_id) AS held
              FROM streamd.consumer_registrations cr
             WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id
        ), quota AS (
            SELECT m.consumer_id, m.member_epoch, x.rn,
                   v_n / v_m + CASE WHEN x.rn <= v_n % v_m THEN 1 ELSE 0 END AS q
              FROM mem m
              JOIN (SELECT m2.consumer_id, row_number() OVER (ORDER BY m2.held DESC, m2.consumer_id) AS rn FROM mem m2) x
                ON x.consumer_id = m.consumer_id
        ), ranked AS (
            SELECT c.partition, c.holder,
                   row_number() OVER (PARTITION BY c.holder ORDER BY (c.owner_id = c.holder) DESC, c.partition) AS k
              FROM cur c WHERE c.holder IS NOT NULL
        ), kept AS (
            SELECT rk.partition, rk.holder FROM ranked rk JOIN quota q ON q.consumer_id = rk.holder WHERE rk.k <= q.q
        ), kept_count AS (
            SELECT k.holder, count(*) AS n FROM kept k GROUP BY k.holder
        ), free AS (
            SELECT c.partition, row_number() OVER (ORDER BY c.partition) AS fn
              FROM cur c WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.partition = c.partition)
        ), slots AS (
            SELECT q.consumer_id, row_number() OVER (ORDER BY q.rn, s.i) AS sn
              FROM quota q
              LEFT JOIN kept_count kc ON kc.holder = q.consumer_id
             CROSS JOIN LATERAL generate_series(1, q.q - coalesce(kc.n, 0)) AS s(i)
        ), want AS (
            SELECT k.partition, k.holder AS new_holder FROM kept k
            UNION ALL
            SELECT f.partition, s.consumer_id FROM free f JOIN slots s ON s.sn = f.fn
        )
        SELECT c.partition, c.owner_id, c.target_id, w.new_holder, q.member_epoch AS new_epoch
          FROM cur c
          LEFT JOIN want w ON w.partition = c.partition
          LEFT JOIN quota q ON q.consumer_id = w.new_holder
         ORDER BY c.partition
    LOOP
        IF r.new_holder IS NULL THEN
            CONTINUE; -- cannot happen while there are members; keep the row as it is
        ELSIF r.owner_id IS NULL THEN
            UPDATE streamd.consumer_partitions cp
               SET owner_id = r.new_holder, owner_epoch = r.new_epoch, target_id = NULL, target_since = NULL, assigned_at = p_now
             WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.partition = r.partition;
            v_changed := v_changed + 1;
        ELSIF r.owner_id = r.new_holder THEN
            IF r.target_id IS NOT NULL THEN
                UPDATE streamd.consumer_partitions cp SET target_id = NULL, target_since = NULL
                 WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.partition = r.partition;
                v_changed := v_changed + 1;
            END IF;
        ELSIF r.target_id IS DISTINCT FROM r.new_holder THEN
            UPDATE streamd.consumer_partitions cp SET target_id = r.new_holder, target_since = p_now
             WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.partition = r.partition;
            v_changed := v_changed + 1;
        END IF;
    END LOOP;
    IF v_changed > 0 THEN
        PERFORM pg_notify(streamd.cg_channel(p_stream_name, p_group_id), 'assign');
        PERFORM streamd.advise('streamd.group.rebalanced', p_stream_name || '/' || p_group_id,
            jsonb_build_object('stream', p_stream_name, 'group', p_group_id,
                               'group_epoch', (SELECT g.group_epoch FROM streamd.consumer_groups g
                                                WHERE g.stream_name = p_stream_name AND g.group_id = p_group_id),
                               'changed', v_changed, 'at', p_now)
            || streamd.advise_assignment(p_stream_name, p_group_id));
    END IF;
    RETURN v_changed;
END;
$$;

-- Joins a member to a group (creating the group) and returns its member epoch, the
-- fence token of its commits. With an instance id that a live member of the group
-- holds (static membership: a restart within the session timeout), the new member
-- takes over that member's partitions without a rebalance, and the old one is fenced.
CREATE OR REPLACE FUNCTION streamd.join_group(
    p_stream_name          text,
    p_group_id             text,
    p_consumer_id          text,
    p_instance_id          text,
    p_session_timeout_ms   integer,
    p_rebalance_timeout_ms integer,
    p_now                  timestamptz
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz;
    v_epoch bigint;
    v_old   text;
BEGIN
    IF p_consumer_id IS NULL OR length(p_consumer_id) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105', MESSAGE = format('invalid consumer id %L: use 1 to 255 characters', p_consumer_id);
    END IF;
    IF p_instance_id IS NOT NULL AND length(p_instance_id) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105', MESSAGE = format('invalid instance id %L: use 1 to 255 characters', p_instance_id);
    END IF;
    IF p_session_timeout_ms IS NULL OR p_session_timeout_ms <= 0 OR p_rebalance_timeout_ms IS NULL OR p_rebalance_timeout_ms <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('session timeout %s ms and rebalance timeout %s ms must be positive', p_session_timeout_ms, p_rebalance_timeout_ms);
    END IF;
    -- A group id with live Kafka classic members is a classic group (0220_kafka_groups.sql).
    IF EXISTS (SELECT 1 FROM streamd.kafka_group_members km
                WHERE km.group_id = p_group_id
                  AND km.last_heartbeat + km.session_timeout_ms * interval '1 millisecond' >= coalesce(p_now, clock_timestamp())) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD151',
            MESSAGE = format('group %L is a Kafka classic group with live members; a streamd member cannot join it', p_group_id);
    END IF;
    PERFORM streamd.cg_lock_group(p_stream_name, p_group_id, true);
    -- After the lock (the clock rule): a join that waited for the group row must not
    -- register a session that began before it got in.
    v_now := coalesce(p_now, clock_timestamp());
    PERFORM streamd.cg_expire(p_stream_name, p_group_id, v_now);
    UPDATE streamd.consumer_groups g SET group_epoch = g.group_epoch + 1, updated_at = v_now
     WHERE g.stream_name = p_stream_name AND g.group_id = p_group_id
    RETURNING g.group_epoch INTO v_epoch;

    IF p_instance_id IS NOT NULL THEN
        SELECT cr.consumer_id INTO v_old FROM streamd.consumer_registrations cr
         WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id AND cr.instance_id = p_instance_id
           FOR UPDATE;
        IF FOUND THEN
            PERFORM streamd.advise_member_gone(p_stream_name, p_group_id, v_old, 'instance_replaced', v_now);
            -- FOR UPDATE: the owner changes, so an in-flight commit of the old member
            -- (FOR KEY SHARE) must end first and later ones must find nothing (G1).
            -- SKIP LOCKED: the join does not wait for it holding the group row; a
            -- partition whose commit is in flight stays the old member's (an orphan
            -- once its registration is renamed below) and comes to the new member,
            -- as its pending target, when that commit ended (cg_move_orphans).
            UPDATE streamd.consumer_partitions cp SET owner_id = p_consumer_id, owner_epoch = v_epoch
             WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id
               AND cp.partition IN (SELECT l.partition FROM streamd.consumer_partitions l
                                     WHERE l.stream_name = p_stream_name AND l.group_id = p_group_id AND l.owner_id = v_old
                                     ORDER BY l.partition FOR UPDATE SKIP LOCKED);
            UPDATE streamd.consumer_partitions cp SET target_id = p_consumer_id, target_since = v_now
             WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.owner_id = v_old
               AND cp.target_id IS NULL;
            UPDATE streamd.consumer_registrations cr
               SET consumer_id = p_consumer_id, member_epoch = v_epoch, last_heartbeat = v_now, last_poll_at = v_now,
                   session_timeout_ms = p_session_timeout_ms, rebalance_timeout_ms = p_rebalance_timeout_ms
             WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id AND cr.consumer_id = v_old;
            UPDATE streamd.consumer_partitions cp SET target_id = p_consumer_id
             WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.target_id = v_old;
            PERFORM streamd.cg_assign(p_stream_name, p_group_id, v_now);
            RETURN v_epoch;
        END IF;
    END IF;

    BEGIN
        INSERT INTO streamd.consumer_registrations (stream_name, group_id, consumer_id, registered_at, last_heartbeat,
                                                    session_timeout_ms, member_epoch, instance_id, rebalance_timeout_ms, last_poll_at)
        VALUES (p_stream_name, p_group_id, p_consumer_id, v_now, v_now,
                p_session_timeout_ms, v_epoch, p_instance_id, p_rebalance_timeout_ms, v_now);
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('consumer id %L is already a member of group %L of stream %L; join with a new id', p_consumer_id, p_group_id, p_stream_name);
    END;
    PERFORM streamd.cg_assign(p_stream_name, p_group_id, v_now);
    PERFORM pg_notify(streamd.cg_channel(p_stream_name, p_group_id), 'join');
    RETURN v_epoch;
END;
$$;

-- Raises the fencing of a member's call, with the reason as its SQLSTATE (each a
-- subcase of SD101, which none raises any more):
--   SD108 session expired: the member is past its session timeout at p_now, or is no
--         longer registered (its expiry was processed, it left, a restart with its
--         instance id replaced it, or an admin reset removed it);
--   SD110 stale epoch: it is registered under another epoch;
--   SD109 partition moved: it is live at p_epoch, but p_partition is not its own
--         (moved to another member, or to nobody yet).
-- It reads the registration again for that: the caller's check already failed, so
-- this only names the cause (a race with a concurrent change names the newer one).
CREATE OR REPLACE FUNCTION streamd.cg_raise_fenced(p_stream_name text, p_group_id text, p_consumer_id text,
                                                   p_epoch bigint, p_partition integer, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
    v_live  boolean;
    v_owner text;
    v_who   text := format('member %s (epoch %s) of group %L of stream %L is fenced',
                           p_consumer_id, p_epoch, p_group_id, p_stream_name);
BEGIN
    SELECT cr.member_epoch, cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= p_now
      INTO v_epoch, v_live
      FROM streamd.consumer_registrations cr
     WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id AND cr.consumer_id = p_consumer_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SD108', MESSAGE = v_who ||
            ': session expired (it is no longer a member: its session timed out, it left, or it was replaced)';
    ELSIF v_epoch <> p_epoch THEN
        RAISE EXCEPTION USING ERRCODE = 'SD110',
            MESSAGE = format('%s: stale epoch (the member is at epoch %s now)', v_who, v_epoch);
    ELSIF NOT v_live OR p_partition IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD108', MESSAGE = v_who ||
            ': session expired (no heartbeat within its session timeout)';
    END IF;
    SELECT cp.owner_id INTO v_owner FROM streamd.consumer_partitions cp
     WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.partition = p_partition;
    RAISE EXCEPTION USING ERRCODE = 'SD109',
        MESSAGE = format('%s: partition moved (partition %s is not its own at this epoch; owner now: %s)',
                         v_who, p_partition, coalesce(v_owner, 'none'));
END;
$$;

-- Raises the fencing of a member whose session ended for a reason the caller knows
-- (it was expelled; its session ended while the transaction committing its offsets
-- was open): SD108, session expired, with that reason in the message.
CREATE OR REPLACE FUNCTION streamd.cg_raise_session_ended(p_stream_name text, p_group_id text, p_consumer_id text,
                                                          p_epoch bigint, p_detail text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'SD108',
        MESSAGE = format('member %s (epoch %s) of group %L of stream %L is fenced: session expired (%s)',
                         p_consumer_id, p_epoch, p_group_id, p_stream_name, p_detail);
END;
$$;

-- A member's heartbeat: records that it is alive and returns its assignment: the
-- partitions it owns, those of them it must release (another member is waiting for
-- them), and those paused. A member that is unknown, at another epoch or past its
-- session timeout is fenced (cg_raise_fenced: SD108, SD110) and must drop its partitions and join again.
-- It also expires dead members and rebalances when that is needed, so a group with
-- live members heals without the streamd daemon.
CREATE OR REPLACE FUNCTION streamd.group_heartbeat(
    p_stream_name text,
    p_group_id    text,
    p_consumer_id text,
    p_epoch       bigint,
    p_now         timestamptz
) RETURNS TABLE (assigned integer[], revoking integer[], paused integer[])
LANGUAGE plpgsql AS $$
DECLARE
    -- The clock rule: the member's own session is judged at the heartbeat's arrival
    -- (a heartbeat that waited for the group row behind other group operations was in
    -- time when it came); what it stores and how it judges the others is the time
    -- after its locks.
    v_arrived timestamptz := coalesce(p_now, statement_timestamp());
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_slow    boolean;
BEGIN
    v_slow := EXISTS (SELECT 1 FROM streamd.consumer_registrations cr
                WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id
                  AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' < v_now)
       OR EXISTS (SELECT 1 FROM streamd.consumer_partitions cp
                   JOIN streamd.consumer_registrations cr USING (stream_name, group_id)
                  WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id
                    AND cr.consumer_id = cp.owner_id AND cp.target_id IS NOT NULL
                    AND cp.target_since + cr.rebalance_timeout_ms * interval '1 millisecond' < v_now)
       OR EXISTS (SELECT 1 FROM streamd.consumer_partitions cp
                   WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.owner_id IS NULL)
       OR streamd.cg_has_orphans(p_stream_name, p_group_id)
       OR (SELECT count(*) FROM streamd.consumer_partitions cp
            WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id)
          < (SELECT s.partitions FROM streamd.streams s WHERE s.stream_name = p_stream_name);
    IF v_slow THEN
        -- Lock order: group row first, then our registration (below).
        PERFORM 1 FROM streamd.consumer_groups g
         WHERE g.stream_name = p_stream_name AND g.group_id = p_group_id FOR NO KEY UPDATE;
    END IF;

    -- Our own row first: locked, so that the time taken next is after any wait for it
    -- (a concurrent expiry holds it FOR UPDATE), and refreshed before cg_expire below
    -- judges the members by that time, which must not expel us for the wait.
    PERFORM 1 FROM streamd.consumer_registrations cr
     WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id
       AND cr.consumer_id = p_consumer_id AND cr.member_epoch = p_epoch
       AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= v_arrived
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM streamd.cg_raise_fenced(p_stream_name, p_group_id, p_consumer_id, p_epoch, NULL, v_arrived);
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    UPDATE streamd.consumer_registrations cr SET last_heartbeat = v_now
     WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id
       AND cr.consumer_id = p_consumer_id AND cr.member_epoch = p_epoch;

    IF v_slow THEN
        IF streamd.cg_expire(p_stream_name, p_group_id, v_now) > 0 THEN
            UPDATE streamd.consumer_groups g SET group_epoch = g.group_epoch + 1, updated_at = v_now
             WHERE g.stream_name = p_stream_name AND g.group_id = p_group_id;
            PERFORM pg_notify(streamd.cg_channel(p_stream_name, p_group_id), 'expire');
            -- cg_expire may have expelled us (we kept a partition another member waits
            -- for past our rebalance timeout): fenced, as any later call of ours is.
            PERFORM 1 FROM streamd.consumer_registrations cr
             WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id
               AND cr.consumer_id = p_consumer_id AND cr.member_epoch = p_epoch;
            IF NOT FOUND THEN
                PERFORM streamd.cg_raise_session_ended(p_stream_name, p_group_id, p_consumer_id, p_epoch,
                    'expelled: it kept a partition another member waits for past its rebalance timeout');
            END IF;
        END IF;
        PERFORM streamd.cg_assign(p_stream_name, p_group_id, v_now);
    END IF;

    RETURN QUERY
        SELECT coalesce(array_agg(cp.partition ORDER BY cp.partition), '{}'),
               coalesce(array_agg(cp.partition ORDER BY cp.partition) FILTER (WHERE cp.target_id IS NOT NULL), '{}'),
               coalesce(array_agg(cp.partition ORDER BY cp.partition) FILTER (WHERE cp.paused), '{}')
          FROM streamd.consumer_partitions cp
         WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id
           AND cp.owner_id = p_consumer_id AND cp.owner_epoch = p_epoch;
END;
$$;

-- Releases partitions the member owns (after it finished and committed them): each
-- goes to its pending target at once, or back to the assignor. Partitions the member
-- does not own are ignored. Fenced (cg_raise_fenced) when not a member at that epoch.
CREATE OR REPLACE FUNCTION streamd.release_partitions(
    p_stream_name text,
    p_group_id    text,
    p_consumer_id text,
    p_epoch       bigint,
    p_partitions  integer[],
    p_now         timestamptz
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM streamd.cg_lock_group(p_stream_name, p_group_id, false);
    PERFORM 1 FROM streamd.consumer_registrations cr
     WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id
       AND cr.consumer_id = p_consumer_id AND cr.member_epoch = p_epoch;
    IF NOT FOUND THEN
        PERFORM streamd.cg_raise_fenced(p_stream_name, p_group_id, p_consumer_id, p_epoch, NULL, v_now);
    END IF;
    -- FOR UPDATE: conflicts with the FOR KEY SHARE of an in-flight commit (cg_fence).
    PERFORM 1 FROM streamd.consumer_partitions cp
     WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.partition = ANY (p_partitions)
       AND cp.owner_id = p_consumer_id AND cp.owner_epoch = p_epoch
     ORDER BY cp.partition FOR UPDATE;
    v_now := coalesce(p_now, clock_timestamp());
    UPDATE streamd.consumer_partitions cp
       SET owner_id = cp.target_id,
           owner_epoch = (SELECT r.member_epoch FROM streamd.consumer_registrations r
                           WHERE r.stream_name = p_stream_name AND r.group_id = p_group_id AND r.consumer_id = cp.target_id),
           target_id = NULL, target_since = NULL, assigned_at = v_now
     WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.partition = ANY (p_partitions)
       AND cp.owner_id = p_consumer_id AND cp.owner_epoch = p_epoch;
    PERFORM streamd.cg_assign(p_stream_name, p_group_id, v_now);
    PERFORM pg_notify(streamd.cg_channel(p_stream_name, p_group_id), 'release');
END;
$$;

-- A clean leave: the member's partitions go to their targets or are reassigned at
-- once, except one whose row an in-flight commit of the member holds: it follows when
-- that transaction ends (cg_drop_member without waiting; the commit itself is refused
-- at COMMIT, the member being gone). Returns false when the member was not there
-- (already expired or fenced).
CREATE OR REPLACE FUNCTION streamd.leave_group(
    p_stream_name text,
    p_group_id    text,
    p_consumer_id text,
    p_epoch       bigint,
    p_now         timestamptz
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM 1 FROM streamd.consumer_groups g
     WHERE g.stream_name = p_stream_name AND g.group_id = p_group_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    PERFORM 1 FROM streamd.consumer_registrations cr
     WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id
       AND cr.consumer_id = p_consumer_id AND cr.member_epoch = p_epoch;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM streamd.cg_drop_member(p_stream_name, p_group_id, p_consumer_id, v_now, false);
    UPDATE streamd.consumer_groups g SET group_epoch = g.group_epoch + 1, updated_at = v_now
     WHERE g.stream_name = p_stream_name AND g.group_id = p_group_id;
    PERFORM streamd.cg_expire(p_stream_name, p_group_id, v_now);
    PERFORM streamd.cg_assign(p_stream_name, p_group_id, v_now);
    PERFORM pg_notify(streamd.cg_channel(p_stream_name, p_group_id), 'leave');
    RETURN true;
END;
$$;

-- The fence: locks the ownership rows of p_partitions (FOR KEY SHARE, ascending) where
-- the member owns them at p_epoch and is a live member; raises the fencing (cg_raise_fenced) for the first
-- partition it does not own. The locks hold until the caller's transaction ends, so a
-- handover (which locks the row FOR UPDATE before changing its owner) cannot pass a
-- commit that was accepted; updates that move no partition (a pending target, pause)
-- take FOR NO KEY UPDATE and do not wait for it.
CREATE OR REPLACE FUNCTION streamd.cg_fence(
    p_stream_name text,
    p_group_id    text,
    p_consumer_id text,
    p_epoch       bigint,
    p_partitions  integer[],
    p_now         timestamptz
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_locked integer[];
    v_first  integer;
BEGIN
    SELECT coalesce(array_agg(x.partition), '{}') INTO v_locked FROM (
        SELECT cp.partition FROM streamd.consumer_partitions cp
         WHERE cp.stream_name = p_stream_name AND cp.group_id = p_group_id AND cp.partition = ANY (p_partitions)
           AND cp.owner_id = p_consumer_id AND cp.owner_epoch = p_epoch
           AND EXISTS (SELECT 1 FROM streamd.consumer_registrations cr
                        WHERE cr.stream_name = p_stream_name AND cr.group_id = p_group_id
                          AND cr.consumer_id = p_consumer_id AND cr.member_epoch = p_epoch
                          AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= p_now)
         ORDER BY cp.partition
           FOR KEY SHARE OF cp) x;
    SELECT min(u.p) INTO v_first FROM unnest(p_partitions) AS u(p) WHERE u.p <> ALL (v_locked);
    IF v_first IS NOT NULL THEN
        PERFORM streamd.cg_raise_fenced(p_stream_name, p_group_id, p_consumer_id, p_epoch, v_first, p_now);
    END IF;
END;
$$;

-- Raises SD105 when a partition appears twice, or an offset to commit is not between 0
-- and its partition's log end. The arrays have the same length.
CREATE OR REPLACE FUNCTION streamd.cg_check_offsets(p_stream_name text, p_partitions integer[], p_offsets bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_bad record;
BEGIN
    IF (SELECT count(DISTINCT u.p) FROM unnest(p_partitions) u(p)) <> cardinality(p_partitions) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105', MESSAGE = 'commit offsets: a partition appears twice';
    END IF;
    SELECT u.p, u.o, h.next_offset INTO v_bad
      FROM unnest(p_partitions, p_offsets) AS u(p, o)
      LEFT JOIN streamd.stream_partitions h ON h.stream_name = p_stream_name AND h.partition = u.p
     WHERE u.p IS NULL OR u.o IS NULL OR u.o < 0 OR h.next_offset IS NULL OR u.o > h.next_offset
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('commit offsets: offset %s for partition %s of stream %L is outside [0, %s] (the log end)',
                             v_bad.o, v_bad.p, p_stream_name, coalesce(v_bad.next_offset::text, 'no such partition'));
    END IF;
END;
$$;

-- Commits offsets (the next offset to read, G5) for partitions the member owns at
-- p_epoch. All or nothing: a partition not owned is fenced (cg_raise_fenced) and nothing changes.
-- An offset must lie between 0 and the partition's log end (SD105).
CREATE OR REPLACE FUNCTION streamd.commit_offsets(
    p_stream_name text,
    p_group_id    text,
    p_consumer_id text,
    p_epoch       bigint,
    p_partitions  integer[],
    p_offsets     bigint[],
    p_metadata    text[],
    p_now         timestamptz
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    IF p_partitions IS NULL OR p_offsets IS NULL OR cardinality(p_partitions) <> cardinality(p_offsets)
       OR (p_metadata IS NOT NULL AND cardinality(p_metadata) <> cardinality(p_partitions)) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105', MESSAGE = 'commit offsets: partitions, offsets and metadata must have the same length';
    END IF;
    PERFORM streamd.cg_check_offsets(p_stream_name, p_partitions, p_offsets);

    PERFORM streamd.cg_fence(p_stream_name, p_group_id, p_consumer_id, p_epoch, p_partitions, v_now);
    PERFORM set_config('streamd.cg_check_at_commit', 'on', true); -- see cg_offsets_check_session

    INSERT INTO streamd.consumer_offsets AS co (stream_name, group_id, partition, "offset", committed_by, member_epoch, metadata, updated_at)
    SELECT p_stream_name, p_group_id, u.p, u.o, p_consumer_id, p_epoch, u.m, v_now
      FROM unnest(p_partitions, p_offsets, coalesce(p_metadata, array_fill(NULL::text, ARRAY[cardinality(p_partitions)]))) AS u(p, o, m)
    ON CONFLICT (stream_name, group_id, partition) DO UPDATE
       SET "offset" = EXCLUDED."offset", committed_by = EXCLUDED.committed_by, member_epoch = EXCLUDED.member_epoch,
           metadata = EXCLUDED.metadata, updated_at = EXCLUDED.updated_at;
END;
$$;

-- Commits a handler's batch [p_from, p_next) of one partition, fenced like
-- commit_offsets, and only once: when the group's offset is already past p_from, an
-- earlier attempt of this batch committed (its acknowledgement was lost, and the
-- worker ran the batch again) and SD107 is raised, so the handler's transaction, which
-- would repeat its writes, cannot commit (G4, exactly-once effects with CommitTx).
-- The check is the write's own condition (ON CONFLICT ... DO UPDATE ... WHERE), not a
-- read before it: the fence's lock is shared, so two attempts of a batch can overlap
-- (the first one's COMMIT still in flight when the worker retried); the second then
-- waits for the first one's offset row, under READ COMMITTED re-checks the condition
-- against the row the first committed, writes nothing and raises SD107. Two first
-- commits of a partition meet in the unique index the same way.
CREATE OR REPLACE FUNCTION streamd.commit_batch(
    p_stream_name text,
    p_group_id    text,
    p_consumer_id text,
    p_epoch       bigint,
    p_partition   integer,
    p_from        bigint,
    p_next        bigint,
    p_now         timestamptz
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    -- The clock rule: the session is judged at this call, not at the start of the
    -- handler's transaction (now()), which may be long past.
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_written boolean;
    v_stored  bigint;
BEGIN
    IF p_from IS NULL OR p_next IS NULL OR p_from > p_next THEN
        RAISE EXCEPTION USING ERRCODE = 'SD105',
            MESSAGE = format('commit batch: [%s, %s) is not a batch', p_from, p_next);
    END IF;
    PERFORM streamd.cg_check_offsets(p_stream_name, ARRAY[p_partition], ARRAY[p_next]);
    PERFORM streamd.cg_fence(p_stream_name, p_group_id, p_consumer_id, p_epoch, ARRAY[p_partition], v_now);
    PERFORM set_config('streamd.cg_check_at_commit', 'on', true); -- see cg_offsets_check_session
    INSERT INTO streamd.consumer_offsets AS co (stream_name, group_id, partition, "offset", committed_by, member_epoch, metadata, updated_at)
    VALUES (p_stream_name, p_group_id, p_partition, p_next, p_consumer_id, p_epoch, NULL, v_now)
    ON CONFLICT (stream_name, group_id, partition) DO UPDATE
       SET "offset" = EXCLUDED."offset", committed_by = EXCLUDED.committed_by, member_epoch = EXCLUDED.member_epoch,
           metadata = EXCLUDED.metadata, updated_at = EXCLUDED.updated_at
     WHERE co."offset" <= p_from
    RETURNING true INTO v_written;
    IF v_written IS NULL THEN
        -- The row is locked now (ON CONFLICT locks it even when the WHERE fails), so
        -- this reads the offset that refused the batch.
        SELECT co."offset" INTO v_stored FROM streamd.consumer_offsets co
         WHERE co.stream_name = p_stream_name AND co.group_id = p_group_id AND co.partition = p_partition;
        RAISE EXCEPTION USING ERRCODE = 'SD107',
            MESSAGE = format('group %L of stream %L: partition %s is committed at %s, past this batch''s start %s: an earlier attempt committed it',
                             p_group_id, p_stream_name, p_partition, v_stored, p_from);
    END IF;
END;
$$;

-- The check at COMMIT of the offsets a member committed through commit_batch or
-- commit_offsets (the deferred constraint trigger consumer_offsets_session_check,
-- migration 0016): the member must still be registered at that epoch with a live
-- session at clock_timestamp(), the moment of the COMMIT, else SD108 and the
-- transaction rolls back, the handler's writes with it. A CommitTx transaction kept
-- open while its member was expired or left (a frozen process, a lost connection) is
-- refused when it wakes, not committed behind the back of the group that gave the
-- member up. G1 does not depend on it: the fence's lock already keeps the partition
-- from moving until the transaction ends. Only transactions in which a commit
-- function ran are checked (they set streamd.cg_check_at_commit, transaction-local):
-- offsets written otherwise (a reset, SQL clients that write consumer_offsets
-- themselves, as seed 003's do) are not. The check reads and locks nothing that a
-- heartbeat or expiry waits for.
CREATE OR REPLACE FUNCTION streamd.cg_offsets_check_session() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('streamd.cg_check_at_commit', true), '') <> 'on' THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM streamd.consumer_registrations cr
                    WHERE cr.stream_name = NEW.stream_name AND cr.group_id = NEW.group_id
                      AND cr.consumer_id = NEW.committed_by AND cr.member_epoch = NEW.member_epoch
                      AND cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' >= clock_timestamp()) THEN
        PERFORM streamd.cg_raise_session_ended(NEW.stream_name, NEW.group_id, NEW.committed_by, NEW.member_epoch,
            format('its session expired or it left the group before the transaction that commits partition %s committed',
                   NEW.partition));
    END IF;
    RETURN NULL;
END;
$$;

-- Seed 003: records a heartbeat for a member, without the epoch check of
-- group_heartbeat (kept for the seed's callers; the Go client uses group_heartbeat).
CREATE OR REPLACE FUNCTION streamd.update_consumer_heartbeat(p_stream_name text, p_group_id text, p_consumer_id text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE streamd.consumer_registrations
       SET last_heartbeat = clock_timestamp()
     WHERE stream_name = p_stream_name
       AND group_id = p_group_id
       AND consumer_id = p_consumer_id;
END;
$$;

-- Seed 003: removes every member whose session expired (or that overstayed its
-- rebalance timeout), hands its partitions over, moves the orphans whose in-flight
-- commits ended (cg_move_orphans), and returns how many members were removed.
-- streamd's reaper calls it periodically; heartbeats of live members do the same for
-- their own group.
CREATE OR REPLACE FUNCTION streamd.cleanup_stale_consumers()
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_total integer := 0;
    v_n     integer;
    v_now   timestamptz;
    g       record;
BEGIN
    FOR g IN SELECT DISTINCT cr.stream_name, cr.group_id FROM streamd.consumer_registrations cr
              WHERE cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' < clock_timestamp()
                 OR EXISTS (SELECT 1 FROM streamd.consumer_partitions cp
                             WHERE cp.stream_name = cr.stream_name AND cp.group_id = cr.group_id
                               AND cp.owner_id = cr.consumer_id AND cp.target_id IS NOT NULL
                               AND cp.target_since + cr.rebalance_timeout_ms * interval '1 millisecond' < clock_timestamp())
             UNION
             SELECT cp.stream_name, cp.group_id FROM streamd.consumer_partitions cp
              WHERE cp.owner_id IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM streamd.consumer_registrations r
                                 WHERE r.stream_name = cp.stream_name AND r.group_id = cp.group_id
                                   AND r.consumer_id = cp.owner_id AND r.member_epoch = cp.owner_epoch)
              ORDER BY 1, 2 LOOP
        PERFORM 1 FROM streamd.consumer_groups cg
         WHERE cg.stream_name = g.stream_name AND cg.group_id = g.group_id FOR NO KEY UPDATE;
        v_now := clock_timestamp(); -- after the lock (the clock rule)
        v_n := streamd.cg_expire(g.stream_name, g.group_id, v_now);
        IF v_n > 0 THEN
            UPDATE streamd.consumer_groups cg SET group_epoch = cg.group_epoch + 1, updated_at = v_now
             WHERE cg.stream_name = g.stream_name AND cg.group_id = g.group_id;
            PERFORM pg_notify(streamd.cg_channel(g.stream_name, g.group_id), 'expire');
            v_total := v_total + v_n;
        END IF;
        PERFORM streamd.cg_assign(g.stream_name, g.group_id, v_now);
    END LOOP;
    RETURN v_total;
END;
$$;
