-- Tenants (seeds 000 and 002): an optional tenant_id on events and messages, and
-- row-level security so that a database role bound to a tenant sees and writes only
-- its tenant's rows. docs/tenants.md describes the set-up.
--
-- Who is isolated: only roles listed in streamd.tenant_roles. The table owner (the
-- role streamd itself migrates and runs as) bypasses row-level security, because the
-- tables are not FORCEd; any other role not bound to a tenant passes the policies as
-- before (its GRANTs still decide what it may do). So the default append path pays
-- nothing for tenancy but the column default below, a lookup of a setting per row.
--
-- The default fills tenant_id from the session setting streamd.tenant_id, which
-- streamd.bind_tenant_role sets for the role (ALTER ROLE ... SET). The setting is a
-- convenience, not the security: the policies compare tenant_id with the binding in
-- streamd.tenant_roles, which a tenant role cannot change. Adding a column with a
-- non-volatile default does not rewrite the table; existing rows get NULL.

ALTER TABLE streamd.events   ADD COLUMN tenant_id text DEFAULT nullif(current_setting('streamd.tenant_id', true), '');
ALTER TABLE streamd.messages ADD COLUMN tenant_id text DEFAULT nullif(current_setting('streamd.tenant_id', true), '');

CREATE TABLE streamd.tenant_roles (
    role_name  name        PRIMARY KEY,
    tenant_id  text        NOT NULL CHECK (tenant_id <> ''),
    created_at timestamptz NOT NULL DEFAULT now()
);
-- A tenant role may read its own binding (current_tenant() needs it), not the others'.
ALTER TABLE streamd.tenant_roles ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_roles_own ON streamd.tenant_roles FOR SELECT USING (role_name = current_user);

-- The tenant the current role is bound to, or NULL for a role bound to none. The
-- policies call it through a sub-select, so it runs once per statement, not per row.
CREATE OR REPLACE FUNCTION streamd.current_tenant() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT t.tenant_id FROM streamd.tenant_roles t WHERE t.role_name = current_user
$$;

ALTER TABLE streamd.events ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON streamd.events
    USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))
    WITH CHECK ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()));

ALTER TABLE streamd.messages ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON streamd.messages
    USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))
    WITH CHECK ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()));
