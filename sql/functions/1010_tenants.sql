-- Tenant roles (docs/tenants.md). Applied idempotently on every migrate.

-- Binds an existing database role to a tenant: records the binding the row-level
-- security policies of events and messages check, sets the role's default
-- streamd.tenant_id (so its inserts are stamped without naming the tenant), and grants
-- what appending, reading and the queue need. Re-binding moves the role to another
-- tenant. Run it as the owner of the streamd tables with CREATEROLE (or a superuser).
CREATE OR REPLACE FUNCTION streamd.bind_tenant_role(p_role name, p_tenant_id text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_role text;
    v_part regclass;
BEGIN
    IF p_tenant_id IS NULL OR p_tenant_id = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = 'bind tenant role: the tenant id must not be empty';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p_role) THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005', MESSAGE = format('bind tenant role: role %L does not exist', p_role);
    END IF;
    -- Row-level security does not apply to superusers, BYPASSRLS roles, or the tables'
    -- owner and the roles that inherit its privileges: bound, such a role would look
    -- isolated and see every tenant.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p_role AND (rolsuper OR rolbypassrls))
       OR pg_has_role(p_role, (SELECT c.relowner FROM pg_class c WHERE c.oid = 'streamd.events'::regclass), 'USAGE') THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('bind tenant role: role %L bypasses row-level security (a superuser, BYPASSRLS, or the owner of the streamd tables or a member of it): binding it would isolate nothing', p_role);
    END IF;
    v_role := quote_ident(p_role);
    -- Concurrent GRANTs on one table fail with "tuple concurrently updated":
    -- serialise the bindings (held until the transaction ends).
    PERFORM pg_advisory_xact_lock(hashtext('streamd.tenant_roles'));
    INSERT INTO streamd.tenant_roles (role_name, tenant_id) VALUES (p_role, p_tenant_id)
    ON CONFLICT (role_name) DO UPDATE SET tenant_id = excluded.tenant_id;
    EXECUTE format('ALTER ROLE %s SET streamd.tenant_id = %L', v_role, p_tenant_id);
    EXECUTE format('GRANT USAGE ON SCHEMA streamd TO %s', v_role);
    EXECUTE format('GRANT SELECT ON streamd.streams, streamd.event_types, streamd.tenant_roles, streamd.queues TO %s', v_role);
    -- Appends advance the head rows through streamd.head_reserve and its siblings
    -- (SECURITY DEFINER, sql/functions/0105_log_heads.sql): the role reads the head
    -- rows and may not write them (a role bound before migration 0087 loses what it
    -- was granted then). On versioned streams appends advance the key heads, which
    -- are the tenant's own rows.
    EXECUTE format('GRANT SELECT ON streamd.stream_partitions TO %s', v_role);
    EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON streamd.stream_partitions FROM %s', v_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION streamd.head_reserve(text, integer, integer), streamd.head_give_back(text, integer, bigint),
                    streamd.head_lock(text, integer[]) TO %s', v_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON streamd.key_heads, streamd.snapshots TO %s', v_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON streamd.events TO %s', v_role);
    -- streamd.messages is a view of queue_messages that reads as the caller
    -- (migration 0086); each queue's offsets come from a sequence of its own (below).
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON streamd.messages, streamd.queue_messages, streamd.message_groups TO %s', v_role);
    -- queue_messages' partitions, one per queue (migration 0215): a statement that
    -- names one is checked against its own privileges (queue_partition_make grants
    -- each new one to the bound roles).
    FOR v_part IN SELECT i.inhrelid::regclass FROM pg_catalog.pg_inherits i
                  WHERE i.inhparent = 'streamd.queue_messages'::regclass LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %s', v_part, v_role);
    END LOOP;
    -- Consumer groups, their dead letters and projections, tenant-scoped (migrations
    -- 0061, 0063), and the group views, which read them as the caller.
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON streamd.consumer_groups, streamd.consumer_registrations,
                    streamd.consumer_partitions, streamd.consumer_offsets, streamd.dead_letter_queue,
                    streamd.projections, streamd.queue_dead_letters TO %s', v_role);
    EXECUTE format('GRANT SELECT ON streamd.consumer_group_status, streamd.consumer_group_summary TO %s', v_role);
    -- Kafka classic groups, which consumer_group_status joins (tenant-scoped by
    -- migration 0067: a tenant role sees none of the rows the Kafka listener writes).
    EXECUTE format('GRANT SELECT ON streamd.kafka_groups, streamd.kafka_group_members, streamd.kafka_group_assignments TO %s', v_role);
    EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA streamd TO %s', v_role);
    -- The appends' check for event ids held by other tenants (stored_event_ids, below).
    EXECUTE format('GRANT EXECUTE ON FUNCTION streamd.stored_event_ids(text, text[]) TO %s', v_role);
END;
$$;

-- Removes a role's binding (it then passes the policies like any unbound role: revoke
-- its grants too when it should see nothing) and its EXECUTE on stored_event_ids, which
-- only a binding needs. Returns false when it was not bound.
CREATE OR REPLACE FUNCTION streamd.unbind_tenant_role(p_role name) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('streamd.tenant_roles'));
    DELETE FROM streamd.tenant_roles WHERE role_name = p_role;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    EXECUTE format('ALTER ROLE %s RESET streamd.tenant_id', quote_ident(p_role));
    EXECUTE format('REVOKE EXECUTE ON FUNCTION streamd.stored_event_ids(text, text[]) FROM %s', quote_ident(p_role));
    RETURN true;
END;
$$;

-- Event ids are unique per stream across tenants (the unique index holds them all), but
-- a tenant role reads the events under row-level security: an id held by an event it
-- cannot see (another tenant's, or one without a tenant) looked new to it. The appends
-- refuse such an id (SD005) rather than take an offset and a key version for an event
-- the index then refuses or, under ON CONFLICT DO NOTHING, drops (a hole, L1).

-- The ids of p_event_ids that an event of stream p_stream_name holds, whoever's event
-- it is: it runs as its owner, the owner of the streamd tables (the role that migrated),
-- which row-level security does not apply to. Callers compare it with what they see
-- themselves (streamd.refuse_hidden_event_ids). STABLE: it reads with the caller's
-- snapshot.
--
-- What it reveals: whether an id is used on a stream, nothing of the event or whose it
-- is. A role that may append to the stream learns that anyway (its insert of the id is
-- refused: a unique_violation before these checks). A role that may not append need
-- not learn it, so EXECUTE is not PUBLIC: bind_tenant_role grants it to the roles it
-- binds, the only roles the appends call it for (the owner and unbound roles see every
-- event), and the statement at the end grants it to roles bound before it existed.
-- Migrations and bindings both change the function's privileges (pg_proc row):
-- serialise them with bind_tenant_role's lock, held until the migration commits.
SELECT pg_advisory_xact_lock(hashtext('streamd.tenant_roles'));

CREATE OR REPLACE FUNCTION streamd.stored_event_ids(p_stream_name text, p_event_ids text[]) RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(array_agg(e.event_id), '{}')
      FROM streamd.events e
     WHERE e.stream_name = p_stream_name AND e.event_id = ANY (p_event_ids)
$$;
REVOKE EXECUTE ON FUNCTION streamd.stored_event_ids(text, text[]) FROM PUBLIC;

-- Raises SD005 naming the first of p_event_ids (in their order) that stream
-- p_stream_name holds in an event the current role cannot see, as streamd.append does.
-- Only a tenant role has such events: for any other role it returns at once. The
-- offset trigger and streamd.append_versioned call it before taking offsets, only where
-- row-level security is active for them, so the owner, whom streamd's own append path
-- runs as, does not even pay the tenant lookup; streamd.append calls it after its
-- insert, on its rare path (some ids not stored).
CREATE OR REPLACE FUNCTION streamd.refuse_hidden_event_ids(p_stream_name text, p_event_ids text[]) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_stored text[];
    v_hidden text;
BEGIN
    IF streamd.current_tenant() IS NULL OR coalesce(cardinality(p_event_ids), 0) = 0 THEN
        RETURN;
    END IF;
    v_stored := streamd.stored_event_ids(p_stream_name, p_event_ids);
    IF cardinality(v_stored) = 0 THEN
        RETURN;
    END IF;
    SELECT x.e INTO v_hidden
      FROM unnest(p_event_ids) WITH ORDINALITY AS x(e, i)
     WHERE x.e = ANY (v_stored)
       AND NOT EXISTS (SELECT 1 FROM streamd.events e WHERE e.stream_name = p_stream_name AND e.event_id = x.e)
     ORDER BY x.i LIMIT 1;
    IF v_hidden IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SD005',
            MESSAGE = format('event id %L is already used on stream %L by an event this role cannot see (another tenant''s)',
                             v_hidden, p_stream_name);
    END IF;
END;
$$;

-- Roles bound before stored_event_ids existed get what bind_tenant_role now grants.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT t.role_name FROM streamd.tenant_roles t JOIN pg_catalog.pg_roles ro ON ro.rolname = t.role_name LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION streamd.stored_event_ids(text, text[]) TO %s', quote_ident(r.role_name));
    END LOOP;
END;
$$;
