-- A FIFO receive reads only the groups it takes (issue 22, bench/RESULTS.md session
-- 11). It takes the queue's groups that may deliver, least recently served first:
-- ORDER BY visible_at, group_key ... LIMIT. message_groups_visible (stream_name,
-- visible_at) gave the first key only, so the planner either sorted the groups that
-- share each visible_at (an incremental sort; the groups a send creates or an ack
-- moves share one) or, when its statistics priced that higher, read and sorted every
-- group of the queue that may deliver, at every receive (seen on a queue of 1,000
-- groups: 1,000 group rows read for a receive of 100). With group_key in the index
-- the scan returns the groups in the receive's order and stops at its LIMIT.
--
-- The index holds the same rows and one more column, which nothing updates: group
-- updates stay as they were (not HOT: visible_at is indexed, as before).
--
-- Locks: the build takes message_groups' SHARE lock (FIFO sends, receives and
-- settlements wait) for the time it reads the table, which is small: a row per FIFO
-- group that holds messages. The DROP INDEX takes the ACCESS EXCLUSIVE lock, held
-- until the migration's transaction commits (after the function files are applied
-- again). Nothing moves: groups, messages and leases in flight are untouched.
--
-- An index of that name left INVALID by a failed CREATE INDEX CONCURRENTLY (built
-- beforehand, as docs/operations.md suggests) is dropped and built again, so the old
-- index is never dropped without a usable new one.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE c.relname = 'message_groups_ready' AND c.relnamespace = 'streamd'::regnamespace
                 AND NOT i.indisvalid) THEN
        DROP INDEX streamd.message_groups_ready;
    END IF;
END
$$;
CREATE INDEX IF NOT EXISTS message_groups_ready ON streamd.message_groups (stream_name, visible_at, group_key);
DROP INDEX IF EXISTS streamd.message_groups_visible;
