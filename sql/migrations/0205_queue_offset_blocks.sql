-- A queue's sequence counts in steps of 128 (issue 22, bench/RESULTS.md session 15): a
-- send takes one nextval per block of 128 messages (streamd.queue_take_offsets, the
-- client's direct send) where it took one per message, and a batch of up to 128 gets
-- consecutive offsets even while other sends run. A call that takes a single offset
-- (a plain INSERT, a dead-letter move, a redrive) reserves a block and uses its first.
--
-- Nothing moves: the held messages keep their offsets, and every later offset is above
-- them (the next value is the last one taken plus 128; the delayed lane's offsets stay
-- the sequence's plus 2^52). Offsets are no longer dense (they never were gapless).
--
-- Locks: ALTER SEQUENCE takes each queue's sequence in SHARE ROW EXCLUSIVE mode, which
-- nextval's lock conflicts with: sends to the queue (and dead-letter moves into it,
-- redrives, plain INSERTs) wait until the migration's transaction commits, after the
-- function files are applied again. Receives and settlements do not wait. It rewrites
-- no table: milliseconds per queue.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT q.offset_seq FROM streamd.queues q WHERE q.offset_seq IS NOT NULL ORDER BY q.queue_name LOOP
        EXECUTE format('ALTER SEQUENCE %s INCREMENT BY 128', r.offset_seq);
    END LOOP;
END;
$$;
