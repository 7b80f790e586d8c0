-- Queue monitoring for SQL users: streamd.queue_stats at the current time, one row per
-- queue (see sql/functions/0300_messages.sql for the columns).
CREATE OR REPLACE VIEW streamd.queue_status AS
SELECT * FROM streamd.queue_stats(NULL, NULL);
