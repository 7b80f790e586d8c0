-- The delayed lane keeps receives HOT (issue 22). Migration 0099 indexed the lane by
-- visibility_timeout (queue_messages_delayed, partial: lane rows only), but a partial
-- index blocks HOT updates of every row, not only of the rows it holds: PostgreSQL
-- decides HOT by column (any column an index uses, in its key or its predicate). Every
-- lease, extension, nack and release changes visibility_timeout, so since 0099 none
-- of them was HOT (pg_stat_user_tables: n_tup_hot_upd 0 of 157,399 updates): each
-- wrote a new primary-key entry (and a FIFO head-index entry) per message and left a
-- dead one for the receives' scans to read past.
--
-- The lane is now indexed by due_at, the time a lane message was due when it was
-- sent, a column nothing updates (NULL outside the lane). A receive takes the lane's
-- messages with due_at <= now whose visibility_timeout has also passed (a due lane
-- message in flight or nacked with a delay is read past, as the main range reads
-- past its own).
--
-- Locks: ADD COLUMN (no default: no rewrite) and DROP INDEX take the table's ACCESS
-- EXCLUSIVE lock for a moment; the UPDATE writes the lane's rows only; the index is
-- built under the SHARE lock (sends, receives and settlements wait), reading the
-- table once (docs/operations.md).
ALTER TABLE streamd.queue_messages ADD COLUMN IF NOT EXISTS due_at timestamptz;

-- A lane message not in flight is due at its visibility time; one in flight cannot be
-- received before its lease ends, so its lease end will do.
UPDATE streamd.queue_messages SET due_at = visibility_timeout
WHERE "offset" >= 4503599627370496 AND due_at IS NULL;

DROP INDEX IF EXISTS streamd.queue_messages_delayed;
CREATE INDEX IF NOT EXISTS queue_messages_due ON streamd.queue_messages (stream_name, due_at)
    WHERE "offset" >= 4503599627370496;
