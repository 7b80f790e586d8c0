-- Head rows move only through streamd's own functions (issue 20, point 5;
-- docs/tenants.md). A role bound to a tenant needed UPDATE on stream_partitions to
-- append, so it could also move a shared stream's offsets at will (rewind a head,
-- move its log start), for every tenant of the stream. The appends now advance and
-- lock head rows through SECURITY DEFINER functions of the tables' owner
-- (streamd.head_reserve, head_give_back, head_lock: sql/functions/0105_log_heads.sql),
-- and bound roles lose every write privilege on the table.
--
-- reserved_by and reserved_from record which transaction last reserved offsets on a
-- head row and the first offset it reserved there, so that head_give_back can give
-- back only offsets the calling transaction reserved itself (and left unused): a
-- head never goes below what another transaction took. Neither column is indexed,
-- so the appends' updates stay HOT.
ALTER TABLE streamd.stream_partitions
    ADD COLUMN IF NOT EXISTS reserved_by   xid8,
    ADD COLUMN IF NOT EXISTS reserved_from bigint;

-- Bindings and migrations both change privileges: serialise them as
-- bind_tenant_role does (the lock is held until the migration commits).
SELECT pg_advisory_xact_lock(hashtext('streamd.tenant_roles'));
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT t.role_name FROM streamd.tenant_roles t JOIN pg_catalog.pg_roles ro ON ro.rolname = t.role_name LOOP
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON streamd.stream_partitions FROM %s', quote_ident(r.role_name));
    END LOOP;
END;
$$;
