-- The queue's delayed lane (issue 22, DESIGN.md "The queue's storage"): a message sent
-- to a standard queue with a delay takes its offset from the queue's sequence plus
-- 2^52 (4503599627370496), which puts it after every message sent without one in the
-- primary key, so that a receive reading the key in offset order never reads past it.
-- This partial index finds those messages once they are due; it holds only them.
-- Messages delayed before this migration keep their offsets (a receive reads past
-- them until they are received, as it did).
CREATE INDEX IF NOT EXISTS queue_messages_delayed ON streamd.queue_messages (stream_name, visibility_timeout)
    WHERE "offset" >= 4503599627370496;
