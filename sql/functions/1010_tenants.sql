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
    -- Appends advance the head rows and, on versioned streams, the key heads.
    EXECUTE format('GRANT SELECT, UPDATE ON streamd.stream_partitions TO %s', v_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON streamd.key_heads, streamd.snapshots TO %s', v_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON streamd.events TO %s', v_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON streamd.messages, streamd.message_groups TO %s', v_role);
    EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA streamd TO %s', v_role);
END;
$$;

-- Removes a role's binding (it then passes the policies like any unbound role: revoke
-- its grants too when it should see nothing). Returns false when it was not bound.
CREATE OR REPLACE FUNCTION streamd.unbind_tenant_role(p_role name) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('streamd.tenant_roles'));
    DELETE FROM streamd.tenant_roles WHERE role_name = p_role;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    EXECUTE format('ALTER ROLE %s RESET streamd.tenant_id', quote_ident(p_role));
    RETURN true;
END;
$$;
