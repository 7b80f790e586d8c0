-- One dead-letter vocabulary for groups and queues, and redelivery of a group's dead
-- letters to that group only (issue 20, point 2; DESIGN.md, "Dead letters redelivered
-- to their group only" and "One dead-letter vocabulary").

-- Group dead letters: seed 000's "resolved" (without replay) joins pending, replayed
-- and discarded; the error's detail (seed 000's error_stacktrace); and when a replayed
-- dead letter was redelivered to its group (NULL while it waits for the partition's
-- owner). Replays made before this migration appended the event to the stream again:
-- they count as redelivered.
ALTER TABLE streamd.dead_letter_queue ADD COLUMN IF NOT EXISTS error_detail text;
ALTER TABLE streamd.dead_letter_queue ADD COLUMN IF NOT EXISTS redelivered_at timestamptz;
ALTER TABLE streamd.dead_letter_queue DROP CONSTRAINT IF EXISTS dead_letter_queue_status_check;
ALTER TABLE streamd.dead_letter_queue ADD CONSTRAINT dead_letter_queue_status_check
    CHECK (status IN ('pending', 'replayed', 'discarded', 'resolved'));
UPDATE streamd.dead_letter_queue SET redelivered_at = coalesce(resolved_at, last_failure_at)
 WHERE status = 'replayed' AND redelivered_at IS NULL;
-- The redeliveries waiting for a partition's owner: small (replayed, not yet handled).
CREATE INDEX IF NOT EXISTS dead_letter_queue_redeliveries ON streamd.dead_letter_queue (stream_name, group_id, partition, "offset")
    WHERE status = 'replayed' AND redelivered_at IS NULL;

-- Queue dead letters: the messages a dead-letter queue holds are the queue's rows; their
-- record (status, who and when, error, attempts, first and last failure) is kept here,
-- one per (dead-letter queue, message id), written by streamd.queue_dead_lettered in
-- the transaction that moves the message. A message that fails again after a replay
-- comes back to the same record (attempts added, pending again).
CREATE TABLE IF NOT EXISTS streamd.queue_dead_letters (
    dead_letter_queue text        NOT NULL,
    message_id        text        NOT NULL,
    origin_queue      text        NOT NULL,
    origin_offset     bigint,
    status            text        NOT NULL DEFAULT 'pending'
                                  CHECK (status IN ('pending', 'replayed', 'discarded', 'resolved')),
    error             text,
    error_detail      text,
    attempts          integer     NOT NULL DEFAULT 1 CHECK (attempts >= 0),
    first_failure_at  timestamptz NOT NULL,
    last_failure_at   timestamptz NOT NULL,
    resolved_at       timestamptz,
    resolved_by       text,
    tenant_id         text        DEFAULT nullif(current_setting('streamd.tenant_id', true), ''),
    PRIMARY KEY (dead_letter_queue, message_id)
);
CREATE INDEX IF NOT EXISTS queue_dead_letters_status ON streamd.queue_dead_letters (dead_letter_queue, status);
ALTER TABLE streamd.queue_dead_letters ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON streamd.queue_dead_letters;
CREATE POLICY tenant_isolation ON streamd.queue_dead_letters
    USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))
    WITH CHECK ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()));

-- Roles bound to a tenant may use it as they use the group dead letters
-- (bind_tenant_role grants it to roles bound from now on).
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT t.role_name FROM streamd.tenant_roles t JOIN pg_catalog.pg_roles ro ON ro.rolname = t.role_name LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON streamd.queue_dead_letters TO %s', quote_ident(r.role_name));
    END LOOP;
END;
$$;

-- The dead letters dead-letter queues hold now get their record.
INSERT INTO streamd.queue_dead_letters (dead_letter_queue, message_id, origin_queue, origin_offset, error, attempts,
                                        first_failure_at, last_failure_at, tenant_id)
SELECT m.stream_name, m.message_id, m.origin_stream, m.origin_offset, m.last_error, coalesce(m.origin_attempts, 0),
       coalesce(m.dead_lettered_at, m.enqueued_at), coalesce(m.dead_lettered_at, m.enqueued_at), m.tenant_id
  FROM streamd.messages m
 WHERE m.origin_stream IS NOT NULL
ON CONFLICT DO NOTHING;

-- dead_letter_event takes the error's detail (sql/doc.go: a changed signature is
-- dropped here).
DROP FUNCTION IF EXISTS streamd.dead_letter_event(text, text, text, bigint, integer, bigint, text, integer, timestamptz, timestamptz);
