-- A FIFO ack writes no group row (issue 22, bench/RESULTS.md session 13 (fifo13)).
-- An ack deleted its messages and then locked each of their groups, looked up the
-- group's next head and moved the group to the back of the round robin (a version
-- that is not HOT: visible_at is in message_groups_ready). It now deletes its
-- messages as a standard ack does, and only a group it leaves empty goes. A receive
-- tells a group in flight by its head (leased, its lease not over) rather than by the
-- group row, and moves the group to the back when it takes the head (visible_at =
-- now). lease_end, the receive's mark of a group in flight (migration 0195), goes.
--
-- What moves: a group whose head is leased must not wait past now for its next
-- delivery, since the ack of that head will not write the group. Before this
-- migration such a group had visible_at at its lease's end (a receive before migration
-- 0195, or an extension) or lease_end set; its visible_at becomes now if it was later.
-- Nothing else changes: every group and message stays, in flight, leased, delayed
-- (a group whose head is not leased keeps its visible_at) or dead-lettered (dead
-- letters hold no group row), and a lease taken before the migration settles with its
-- token.
--
-- Locks: the UPDATE takes message_groups' ROW EXCLUSIVE lock and the row locks of the
-- groups whose head is leased (FIFO sends, nacks and extensions of those groups wait);
-- DROP COLUMN then takes message_groups' ACCESS EXCLUSIVE lock (FIFO sends, receives
-- and settlements wait, and so do every redrive, purge and queue deletion, of standard
-- queues too; standard sends, receives and acks do not) until the migration's
-- transaction commits, after the function files are applied again. DROP COLUMN changes
-- only the catalog; the UPDATE reads message_groups once, and the head of each group
-- whose visible_at is later than now through queue_messages_group.
UPDATE streamd.message_groups g SET visible_at = now()
WHERE g.visible_at > now()
  AND (SELECT m.lease_token IS NOT NULL FROM streamd.queue_messages m
       WHERE m.stream_name = g.stream_name AND m.group_key = g.group_key AND coalesce(m.tenant_id, '') = g.tenant_id
       ORDER BY m."offset" LIMIT 1);
ALTER TABLE streamd.message_groups DROP COLUMN IF EXISTS lease_end;
