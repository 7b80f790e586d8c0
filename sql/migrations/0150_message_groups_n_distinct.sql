-- FIFO groups are looked up by their primary key (issue 22, bench/RESULTS.md session
-- 10). The planner estimated a queue's groups as message_groups' rows divided by the
-- number of queues it sampled: after an ANALYZE of many small queues, a handful. A
-- lookup of one group by (stream_name, group_key, tenant_id) then cost it no more
-- through message_groups_visible (stream_name, visible_at), filtering every group of
-- the queue, than through the primary key, and the FIFO receive's and settlements'
-- joins of a batch's groups to message_groups scanned every group of the queue once
-- per group of the batch: 100 x 1,000 rows for a receive of 100 in a queue of 1,000
-- groups (TestFIFOGroupStatementsReadOnlyTheirGroups). As migration 0008 does for the
-- messages: a queue is, to the planner, the whole table, so that the primary key wins
-- whenever the table holds more than a few groups.
--
-- Locks: SHARE UPDATE EXCLUSIVE on message_groups for the ALTER and the ANALYZE
-- (sends, receives and settlements go on; another ANALYZE or VACUUM of the table
-- waits); the ANALYZE reads a sample of the table, which is small (a row per FIFO
-- group that holds messages).
ALTER TABLE streamd.message_groups ALTER COLUMN stream_name SET (n_distinct = 1);
ANALYZE streamd.message_groups;
