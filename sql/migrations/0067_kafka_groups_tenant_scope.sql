-- The Kafka classic-group tables (migration 0050) under the tenant policy of
-- migration 0063, so that consumer_group_status, which joins them and reads as the
-- caller, shows a tenant role nothing of another tenant's: their rows get the
-- writer's tenant (none for the Kafka listener, which writes as streamd itself).
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['kafka_groups', 'kafka_group_members', 'kafka_group_assignments'] LOOP
        EXECUTE format('ALTER TABLE streamd.%I ADD COLUMN IF NOT EXISTS tenant_id text DEFAULT nullif(current_setting(''streamd.tenant_id'', true), '''')', t);
        EXECUTE format('ALTER TABLE streamd.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY tenant_isolation ON streamd.%I
            USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))
            WITH CHECK ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))', t);
    END LOOP;
END;
$$;
