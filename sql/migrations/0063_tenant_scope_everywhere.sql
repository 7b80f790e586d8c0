-- Tenants isolated everywhere a tenant's data is (issue 20, point 5; docs/tenants.md).
--
-- Migration 0011 put events and messages (and 0014 message_groups) under row-level
-- security; consumer groups and their offsets, the dead letter queue (which holds
-- copies of payloads), key heads and snapshots were shared by every tenant. Each now
-- has tenant_id, filled like the others' from the setting streamd.tenant_id that
-- bind_tenant_role gives the role, and the same policy: a role bound to a tenant sees,
-- updates and deletes only its tenant's rows, and inserts only such rows. The owner
-- (streamd itself) and unbound roles are not affected. Existing rows get NULL: no
-- tenant role sees them.
--
-- Keys stay shared: a group id, a key (its versions) or a snapshot version held by
-- another tenant's row is refused to a tenant role (the insert meets the hidden row),
-- as event ids are.
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['consumer_groups', 'consumer_registrations', 'consumer_partitions', 'consumer_offsets',
                             'dead_letter_queue', 'key_heads', 'snapshots'] LOOP
        EXECUTE format('ALTER TABLE streamd.%I ADD COLUMN tenant_id text DEFAULT nullif(current_setting(''streamd.tenant_id'', true), '''')', t);
        EXECUTE format('ALTER TABLE streamd.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY tenant_isolation ON streamd.%I
            USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))
            WITH CHECK ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))', t);
    END LOOP;
END;
$$;
