-- FIFO message groups per tenant (docs/tenants.md).
--
-- A group row serialises its group and says when it may deliver next; migration 0011
-- gave messages a tenant_id and row-level security but left message_groups shared by
-- every tenant of a queue. A tenant role's receive locked every ready group of the
-- queue, saw only its own messages, leased nothing of the others' groups, and then
-- deleted each of those rows as empty: the other tenant's messages stayed with no
-- group row and were never delivered (queue_purge by a tenant deleted every tenant's
-- groups the same way). A group is now (queue, group key, tenant): each tenant's
-- messages of a group key form their own group, with its own FIFO order and its own
-- one message in flight, and the group rows are under the same policy as messages.
--
-- tenant_id is '' for messages without a tenant (messages.tenant_id IS NULL), since a
-- primary key column cannot be NULL; a tenant id is never '' (tenant_roles' CHECK).
-- The default mirrors messages.tenant_id's; streamd's functions set it explicitly.
ALTER TABLE streamd.message_groups ADD COLUMN tenant_id text NOT NULL DEFAULT '';
ALTER TABLE streamd.message_groups DROP CONSTRAINT message_groups_pkey;
ALTER TABLE streamd.message_groups ADD PRIMARY KEY (stream_name, group_key, tenant_id);
ALTER TABLE streamd.message_groups
    ALTER COLUMN tenant_id SET DEFAULT coalesce(nullif(current_setting('streamd.tenant_id', true), ''), '');

-- Every group that has messages gets its row, for its tenant: this also gives back a
-- row to the groups the shared rows' bug left without one. A new row may deliver now
-- (a receive leases its head only when the head is visible).
INSERT INTO streamd.message_groups (stream_name, group_key, tenant_id, visible_at)
SELECT DISTINCT m.stream_name, m.group_key, coalesce(m.tenant_id, ''), now()
FROM streamd.messages m
JOIN streamd.queues q ON q.queue_name = m.stream_name AND q.fifo
WHERE m.group_key IS NOT NULL
ON CONFLICT (stream_name, group_key, tenant_id) DO NOTHING;
-- The shared rows now stand for the messages without a tenant: drop those with none.
DELETE FROM streamd.message_groups g
WHERE g.tenant_id = ''
  AND NOT EXISTS (SELECT 1 FROM streamd.messages m
                  WHERE m.stream_name = g.stream_name AND m.group_key = g.group_key AND m.tenant_id IS NULL);

ALTER TABLE streamd.message_groups ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON streamd.message_groups
    USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))
    WITH CHECK ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()));
