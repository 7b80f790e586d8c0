-- Every queue's sequence counts in steps of 128, also a queue made while migration 0205
-- ran: 0205 read the queues before it waited (at the function files' triggers on
-- streamd.queues) for a queue_create in flight, whose trigger, still the old one, made
-- a sequence counting in ones, so that the queue's sends took overlapping blocks (a
-- duplicate key; TestMigration0205TakesAQueueMadeWhileItRuns). The lock makes queue
-- creations in flight commit first and later ones wait for the new trigger; only the
-- sequences not in steps of 128 are altered, so sends to the others do not wait.
LOCK TABLE streamd.queues IN SHARE ROW EXCLUSIVE MODE;
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT q.offset_seq FROM streamd.queues q JOIN pg_catalog.pg_sequence s ON s.seqrelid = q.offset_seq
             WHERE s.seqincrement <> 128 ORDER BY q.queue_name LOOP
        EXECUTE format('ALTER SEQUENCE %s INCREMENT BY 128', r.offset_seq);
    END LOOP;
END;
$$;
