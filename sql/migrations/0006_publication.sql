-- Low-latency delivery: the publication the tailer reads. It is created by
-- streamd.wakeup_publication_ensure() (sql/functions/0600_wakeup.sql), which the
-- functions file calls once it is applied (functions run after the migrations) and the
-- tailer calls again on every start, so granting the privilege later is enough.
SELECT 1;
