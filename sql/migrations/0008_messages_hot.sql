-- The queue's hot path writes as little as it can (issue 4's benchmark: send + receive
-- + ack against the raw SKIP LOCKED drain).
--
-- A receive is a HOT update. PostgreSQL updates a row in place (a heap-only tuple, no
-- new index entries) only when no indexed column changes and the page has room. The
-- receive index of 0003 had visibility_timeout as a key column, so every receive, and
-- every extend, wrote a new entry in every index of the table. Receive now finds
-- messages through not_before, which only a send and a nack set (the time before which
-- the message is never delivered: the send's delay, the nack's delay); a receive and an
-- extend change only unindexed columns (lease_token, delivery_attempts,
-- visibility_timeout). visibility_timeout keeps its meaning (the time the message is,
-- again, visible: the lease's end while received), and a receive skips the in-flight
-- rows the index still lists among the ready ones.
--
-- Dedup's unique key leads with message_id, so that the planner cannot take it for a
-- "messages of this queue" index (it did: a bitmap scan of the whole queue and a sort
-- on every receive, update and ack).
ALTER TABLE streamd.messages ADD COLUMN not_before timestamptz;
UPDATE streamd.messages
SET not_before = CASE WHEN lease_token IS NULL THEN visibility_timeout ELSE enqueued_at END;
ALTER TABLE streamd.messages
    ALTER COLUMN not_before SET DEFAULT now(),
    ALTER COLUMN not_before SET NOT NULL;

DROP INDEX streamd.messages_visible;
CREATE INDEX messages_ready ON streamd.messages (stream_name, not_before, "offset");

ALTER TABLE streamd.messages DROP CONSTRAINT messages_stream_message_id;
ALTER TABLE streamd.messages ADD CONSTRAINT messages_message_id_stream UNIQUE (message_id, stream_name);

-- The planner's estimate of "rows of one queue": a queue, unlike most text keys, holds
-- many rows and there are few queues. Left to the statistics of a table whose queues
-- come and go (and whose hot queue is often missing from its most common values), it
-- estimated one row, so it scanned and sorted a whole queue instead of reading the
-- ready index in order up to the receive's limit. n_distinct = 1 makes a generic plan
-- assume a queue is the whole table; the hot functions use generic plans.
ALTER TABLE streamd.messages ALTER COLUMN stream_name SET (n_distinct = 1);
ANALYZE streamd.messages;

-- Room for the receive's new row version on the same page (a HOT update needs it): a
-- receive updates every row of a batch, and a batch's rows share pages. At 80% a page
-- had room for a quarter of its rows' new versions, so three receives in four were
-- not HOT; at 50% every row of a page can be received once before pruning.
ALTER TABLE streamd.messages SET (fillfactor = 50);
