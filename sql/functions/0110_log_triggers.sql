-- L3: a plain INSERT INTO streamd.events from any SQL client or trigger gets a correct
-- offset. The row trigger validates the row, routes it (key hash, else one partition
-- per transaction), and takes its offset from the partition's head row, whatever offset
-- the INSERT named. streamd.append() reserves offsets for a whole batch itself and
-- marks the rows it inserts as trusted for the duration of its own statement only.
--
-- A duplicate event_id already committed is skipped (the INSERT reports 0 rows for it,
-- L4). An event_id held by an event the inserting role cannot see (a tenant role's
-- insert of another tenant's id, docs/tenants.md) is refused with SD005, with or without
-- ON CONFLICT DO NOTHING, as streamd.append refuses it: skipping it would tell the
-- tenant its event is stored. Caveat: an INSERT ... ON CONFLICT DO NOTHING that meets
-- a concurrent, not yet committed duplicate (whoever's) leaves a one-offset hole; use
-- streamd.append() for retried batches, which closes such holes.
CREATE OR REPLACE FUNCTION streamd.events_before_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_stream streamd.streams%ROWTYPE;
    v_size   integer;
    v_kv     bigint;
    v_sid    text;
    v_exp    timestamptz;
    v_now    timestamptz;
    v_named  boolean;
    v_dupkey text;
BEGIN
    SELECT * INTO v_stream FROM streamd.streams s WHERE s.stream_name = NEW.stream_name;
    IF NOT FOUND THEN
        PERFORM streamd.raise_partition_missing(NEW.stream_name, coalesce(NEW.partition, 0));
    END IF;
    IF v_stream.read_only THEN
        PERFORM streamd.raise_read_only(NEW.stream_name);
    END IF;
    -- A key_version given is an expectation (below): refused where it cannot be
    -- checked rather than dropped, so a writer relying on it is told. NULL (what seed
    -- style INSERTs pass, or leave out) is no expectation.
    IF NEW.key_version IS NOT NULL THEN
        IF NOT v_stream.key_versions THEN
            RAISE EXCEPTION USING ERRCODE = 'SD405',
                MESSAGE = format('stream %L does not keep key versions: an insert''s key_version (an expected version) needs them (streamd.set_stream_event_sourcing)', NEW.stream_name);
        ELSIF NEW.key IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'SD005',
                MESSAGE = format('an insert''s key_version (an expected version) needs a key (stream %L, key_version %s)', NEW.stream_name, NEW.key_version);
        END IF;
    END IF;
    IF NEW.partition IS NULL THEN
        IF NEW.key IS NOT NULL THEN
            NEW.partition := streamd.partition_for_key(NEW.key, v_stream.partitions);
        ELSE
            NEW.partition := (pg_current_xact_id()::text::bigint % v_stream.partitions)::integer;
        END IF;
    ELSIF NEW.partition < 0 OR NEW.partition >= v_stream.partitions THEN
        RAISE EXCEPTION USING ERRCODE = 'SD002',
            MESSAGE = format('stream %L has no partition %s (it has %s)', NEW.stream_name, NEW.partition, v_stream.partitions);
    END IF;
    v_size := coalesce(octet_length(NEW.data::text), 0) + coalesce(octet_length(NEW.data_bytes), 0);
    IF v_size > v_stream.max_payload_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'SD004',
            MESSAGE = format('payload of %s bytes exceeds the limit of %s bytes of stream %L', v_size, v_stream.max_payload_bytes, NEW.stream_name);
    END IF;
    v_named := NEW.event_id IS NOT NULL;
    IF NOT v_named THEN
        NEW.event_id := streamd.new_event_id();
    ELSE
        SELECT e.key INTO v_dupkey FROM streamd.events e WHERE e.stream_name = NEW.stream_name AND e.event_id = NEW.event_id;
        IF FOUND THEN
            -- A retry only if it is the same event: on a stream with key versions an
            -- id stored under another key is refused (SD005), as by append_versioned.
            IF v_stream.key_versions AND v_dupkey IS DISTINCT FROM NEW.key THEN
                RAISE EXCEPTION USING ERRCODE = 'SD005',
                    MESSAGE = format('event id %L of stream %L is stored under key %L, not %L', NEW.event_id, NEW.stream_name, v_dupkey, NEW.key);
            END IF;
            RETURN NULL;
        END IF;
        -- Under row-level security the id may be held by an event this role cannot
        -- see, which the unique index would refuse after this took an offset (and
        -- ON CONFLICT DO NOTHING then dropped, leaving a hole): refused now. The owner
        -- (not under row-level security) skips the call.
        IF row_security_active(TG_RELID) THEN
            PERFORM streamd.refuse_hidden_event_ids(NEW.stream_name, ARRAY[NEW.event_id]);
        END IF;
    END IF;
    IF NEW.event_type IS NULL THEN
        NEW.event_type := '';
    END IF;
    IF NEW.version IS NULL THEN
        NEW.version := 1;
    END IF;
    IF v_stream.enforce_event_types
       AND NOT EXISTS (SELECT 1 FROM streamd.event_types et WHERE et.name = NEW.event_type) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD406',
            MESSAGE = format('event type %L is not registered, and stream %L accepts registered types only', NEW.event_type, NEW.stream_name);
    END IF;
    IF v_stream.key_versions AND NEW.key IS NOT NULL
       AND NEW.partition <> streamd.partition_for_key(NEW.key, v_stream.partitions) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('stream %L keeps key versions, so key %L must go to its own partition %s, not %s',
                             NEW.stream_name, NEW.key, streamd.partition_for_key(NEW.key, v_stream.partitions), NEW.partition);
    END IF;
    -- The head row moves through streamd.head_reserve: the inserting role needs no
    -- write privilege on it (docs/tenants.md).
    SELECT hr.base, hr.ts INTO NEW."offset", NEW."timestamp" FROM streamd.head_reserve(NEW.stream_name, NEW.partition, 1) hr;
    IF NEW."offset" IS NULL THEN -- the stream was deleted while this waited: SD001
        PERFORM streamd.raise_partition_missing(NEW.stream_name, NEW.partition);
    END IF;
    PERFORM streamd.append_recheck_rules(NEW.stream_name, v_stream.key_versions, v_stream.enforce_event_types);
    -- A duplicate that committed while this waited for the head row (the same id, the
    -- same key, so the same partition): skipped now, before the key's version moves
    -- (it used to move, and the row was then dropped by ON CONFLICT or refused by the
    -- unique index, leaving the key a version with no event). The offset just taken
    -- is given back: it is the head's last, as this transaction has held the head row
    -- since taking it (before, it stayed a hole, breaking L1's gapless offsets).
    IF v_named THEN
        SELECT e.key INTO v_dupkey FROM streamd.events e WHERE e.stream_name = NEW.stream_name AND e.event_id = NEW.event_id;
        IF FOUND THEN
            IF v_stream.key_versions AND v_dupkey IS DISTINCT FROM NEW.key THEN
                RAISE EXCEPTION USING ERRCODE = 'SD005',
                    MESSAGE = format('event id %L of stream %L is stored under key %L, not %L', NEW.event_id, NEW.stream_name, v_dupkey, NEW.key);
            END IF;
            PERFORM streamd.head_give_back(NEW.stream_name, NEW.partition, NEW."offset");
            RETURN NULL;
        END IF;
        -- The same for an event this role cannot see, committed while this waited:
        -- refused, and the error undoes the offset just taken with the statement.
        IF row_security_active(TG_RELID) THEN
            PERFORM streamd.refuse_hidden_event_ids(NEW.stream_name, ARRAY[NEW.event_id]);
        END IF;
    END IF;
    -- Per-key versions (issue 9), under the head-row lock just taken. A key_version
    -- given by the INSERT is the version the writer expects this event to get
    -- (optimistic concurrency from plain SQL); it is checked, never trusted. An
    -- insert (never in a session) that finds an expired session on the key ends its
    -- hold in the same upsert, as streamd.append_versioned does, so that session
    -- cannot renew as if it had held the key throughout.
    IF v_stream.key_versions AND NEW.key IS NOT NULL THEN
        v_now := clock_timestamp();
        INSERT INTO streamd.key_heads AS h (stream_name, key, last_version, updated_at)
        VALUES (NEW.stream_name, NEW.key, 1, NEW."timestamp")
        ON CONFLICT (stream_name, key) DO UPDATE
           SET last_version = h.last_version + 1, updated_at = excluded.updated_at,
               session_id = CASE WHEN h.session_expires_at <= v_now THEN NULL ELSE h.session_id END,
               session_expires_at = CASE WHEN h.session_expires_at <= v_now THEN NULL ELSE h.session_expires_at END
        RETURNING h.last_version, h.session_id, h.session_expires_at INTO v_kv, v_sid, v_exp;
        IF v_sid IS NOT NULL AND v_exp > v_now THEN
            RAISE EXCEPTION USING ERRCODE = 'SD404',
                MESSAGE = format('key %L of stream %L is held by session %L until %s', NEW.key, NEW.stream_name, v_sid, v_exp);
        END IF;
        IF NEW.key_version IS NOT NULL AND NEW.key_version <> v_kv THEN
            RAISE EXCEPTION USING ERRCODE = 'SD401',
                MESSAGE = format('version mismatch: key %L of stream %L is at version %s, the insert expected to write version %s',
                                 NEW.key, NEW.stream_name, v_kv - 1, NEW.key_version);
        END IF;
        NEW.key_version := v_kv;
    END IF; -- else key_version is NULL: a value given was refused above
    RETURN NEW;
END;
$$;

-- The log is append-only: an event's position and content never change.
CREATE OR REPLACE FUNCTION streamd.events_before_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'SD005',
        MESSAGE = format('events are append-only: cannot update %s/%s@%s', OLD.stream_name, OLD.partition, OLD."offset");
END;
$$;

-- The trusted mark (streamd.append_trusted) is an ordinary setting, which any role
-- that inserts into streamd.events can set: for the owner and unbound roles it guards
-- against mistakes only (docs/tenants.md). A role bound to a tenant gets no more
-- from it than its appends need: a trusted row of a tenant (tenant_id is set: the
-- policy makes a tenant role's rows carry its tenant) must lie in a range of offsets
-- that its own transaction reserved on that partition (streamd.head_reserve records
-- the reserving transaction and its first offset on the head row, which no tenant
-- role may write), else SD005. So a tenant role cannot store or move an event to an
-- offset of its choosing on a shared stream (above the head, where the next append of
-- every tenant would fail on it), nor rewrite its stored events. One primary-key read
-- of the head row per trusted row of a tenant; rows without a tenant skip it (the
-- trigger's WHEN).
CREATE OR REPLACE FUNCTION streamd.events_check_trusted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM streamd.stream_partitions h
      WHERE h.stream_name = NEW.stream_name AND h.partition = NEW.partition
        AND h.reserved_by = pg_current_xact_id() AND NEW."offset" >= h.reserved_from AND NEW."offset" < h.next_offset;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('event %s/%s@%s: a trusted write (streamd.append_trusted) of a tenant''s event needs an offset its transaction reserved (append with streamd.append or a plain INSERT)',
                             NEW.stream_name, NEW.partition, NEW."offset");
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER events_check_trusted
    BEFORE INSERT OR UPDATE ON streamd.events
    FOR EACH ROW
    WHEN (current_setting('streamd.append_trusted', true) = 'on' AND NEW.tenant_id IS NOT NULL)
    EXECUTE FUNCTION streamd.events_check_trusted();

CREATE OR REPLACE TRIGGER events_assign_offset
    BEFORE INSERT ON streamd.events
    FOR EACH ROW
    WHEN (current_setting('streamd.append_trusted', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION streamd.events_before_insert();

CREATE OR REPLACE TRIGGER events_append_only
    BEFORE UPDATE ON streamd.events
    FOR EACH ROW
    WHEN (current_setting('streamd.append_trusted', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION streamd.events_before_update();
