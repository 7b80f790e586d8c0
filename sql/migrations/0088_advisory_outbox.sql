-- Advisories are appended when the reporting transaction commits, not where the fact
-- is made (issue 20, point 4; docs/advisories.md, Cost). streamd.advise appended to
-- the advisory stream at once and so held its one head row from there to the end of
-- the transaction: a transaction that reported a fact and then appended to a stream
-- (a queue receive that dead-letters, then the caller's append), and retention of
-- that stream (its head row, then the unread_deleted advisory) took the two head rows
-- in opposite orders and deadlocked (40P01, one of the two aborted; the test
-- advisory/deadlock_test.go). Now advise writes a row here, and a deferred constraint
-- trigger appends it to streamd.advisories at commit and deletes it: every
-- transaction takes the advisory head row last, after every other lock it takes, and
-- holds it only while it appends advisories, so no wait for it closes a cycle. The
-- advisory still commits exactly with its fact.
--
-- The rows live only inside their transaction (inserted and deleted before it
-- commits): no other session ever sees one, so any role that may call advise may
-- write them.
CREATE TABLE IF NOT EXISTS streamd.advisory_outbox (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    event_type text NOT NULL,
    key        text,
    data       jsonb
);
GRANT SELECT, INSERT, DELETE ON streamd.advisory_outbox TO PUBLIC;

-- The trigger's function; its body is sql/functions/0150_advisories.sql's (re-applied
-- after the migrations): a trigger made here needs the function to exist first.
CREATE OR REPLACE FUNCTION streamd.advisory_outbox_flush() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER advisory_outbox_flush AFTER INSERT ON streamd.advisory_outbox
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION streamd.advisory_outbox_flush();
