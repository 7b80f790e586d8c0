-- One row per stream partition, from the head rows alone (no scan of events):
-- the log start and end offsets, the number of retained offsets, and the last append.
CREATE OR REPLACE VIEW streamd.stream_partition_status AS
SELECT h.stream_name,
       h.partition,
       h.log_start_offset,
       h.next_offset,
       h.next_offset - h.log_start_offset AS retained_offsets,
       h.last_appended_at
  FROM streamd.stream_partitions h;
