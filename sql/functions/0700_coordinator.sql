-- Takes or renews lease p_name for p_holder for p_ttl_ms. Returns the epoch when the
-- caller holds the lease afterwards, NULL when someone else holds an unexpired one.
-- The epoch grows whenever the holder changes.
CREATE OR REPLACE FUNCTION streamd.acquire_lease(p_name text, p_holder text, p_ttl_ms integer, p_now timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, clock_timestamp());
    v_epoch bigint;
BEGIN
    INSERT INTO streamd.leader_leases AS l (name, holder, epoch, acquired_at, renewed_at, expires_at)
    VALUES (p_name, p_holder, 1, v_now, v_now, v_now + make_interval(secs => p_ttl_ms / 1000.0))
    ON CONFLICT (name) DO UPDATE
       SET holder      = EXCLUDED.holder,
           epoch       = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > v_now THEN l.epoch ELSE l.epoch + 1 END,
           acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > v_now THEN l.acquired_at ELSE v_now END,
           renewed_at  = v_now,
           expires_at  = EXCLUDED.expires_at
     WHERE l.holder = EXCLUDED.holder OR l.expires_at <= v_now
    RETURNING l.epoch INTO v_epoch;
    RETURN v_epoch;
END;
$$;

-- Gives lease p_name up at once when p_holder holds it at p_epoch, so another instance
-- can take over without waiting for the expiry. Returns whether it did.
CREATE OR REPLACE FUNCTION streamd.release_lease(p_name text, p_holder text, p_epoch bigint)
RETURNS boolean
LANGUAGE sql AS $$
    WITH r AS (
        UPDATE streamd.leader_leases SET expires_at = clock_timestamp()
         WHERE name = p_name AND holder = p_holder AND epoch = p_epoch AND expires_at > clock_timestamp()
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM r)
$$;

-- Whether p_holder holds lease p_name at p_epoch now. Use it inside the transaction
-- that does a leader's work (with FOR SHARE semantics through lease_fence) to fence it.
CREATE OR REPLACE FUNCTION streamd.holds_lease(p_name text, p_holder text, p_epoch bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM streamd.leader_leases
                    WHERE name = p_name AND holder = p_holder AND epoch = p_epoch AND expires_at > clock_timestamp())
$$;

-- Records that job p_job starts its run for schedule slot p_slot under lease (p_lease,
-- p_holder, p_epoch). Returns false, recording nothing, when the caller no longer holds
-- the lease, or the slot's run already finished, or another holder of a newer epoch
-- is running it. A run that a deposed leader started but never finished is taken over
-- (its work is idempotent: retention, reaping), so each slot finishes exactly once.
-- So is one this epoch started itself: a start that committed but whose answer was
-- lost (a connection dropped after COMMIT) is tried again by the same leader, which
-- must then run the slot (it used to read "finished already" and skip it).
CREATE OR REPLACE FUNCTION streamd.start_coordinator_run(p_job text, p_slot bigint, p_lease text, p_holder text, p_epoch bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT streamd.holds_lease(p_lease, p_holder, p_epoch) THEN
        RETURN false;
    END IF;
    INSERT INTO streamd.coordinator_runs AS r (job, slot, holder, epoch) VALUES (p_job, p_slot, p_holder, p_epoch)
    ON CONFLICT (job, slot) DO UPDATE
       SET holder = EXCLUDED.holder, epoch = EXCLUDED.epoch, started_at = clock_timestamp(), error = NULL
     WHERE r.finished_at IS NULL AND r.epoch <= EXCLUDED.epoch;
    RETURN FOUND;
END;
$$;

-- Marks the run finished, fenced by the epoch that started it. Returns whether it did.
-- A finish also forgets the job's runs more than 1000 slots old: the table keeps the
-- recent history (for operators and the exactly-once-per-slot tests), not every slot
-- since the first (86,400 rows a day for a job run every second).
CREATE OR REPLACE FUNCTION streamd.finish_coordinator_run(p_job text, p_slot bigint, p_epoch bigint, p_error text)
RETURNS boolean
LANGUAGE sql AS $$
    WITH u AS (
        UPDATE streamd.coordinator_runs SET finished_at = clock_timestamp(), error = p_error
         WHERE job = p_job AND slot = p_slot AND epoch = p_epoch AND finished_at IS NULL
        RETURNING 1),
    old AS (
        DELETE FROM streamd.coordinator_runs
         WHERE job = p_job AND slot < p_slot - 1000 AND EXISTS (SELECT 1 FROM u))
    SELECT EXISTS (SELECT 1 FROM u)
$$;
