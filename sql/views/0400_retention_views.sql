-- Monitoring views of retention and group progress. Both are computed from head rows,
-- keys and primary-key probes (two per partition), never by scanning events.

-- Seed 003's retention_policy_status (stream_name, max_age_seconds, max_event_count,
-- enabled, current_event_count, oldest_event, newest_event), plus streamd's policy
-- columns. current_event_count counts retained offsets (next_offset -
-- log_start_offset per partition): exact for a log that is not compacted, an upper
-- bound for one that is. oldest_event and newest_event are the timestamps of the first
-- and last retained events. limits_per says what max_event_count and max_size_bytes
-- count: 'partition' (the seed's max_event_count was per stream; see the columns'
-- comments, migration 0060).
CREATE OR REPLACE VIEW streamd.retention_policy_status AS
SELECT rp.stream_name,
       rp.max_age_seconds,
       rp.max_event_count,
       rp.enabled,
       coalesce(sum(h.next_offset - h.log_start_offset), 0)::bigint AS current_event_count,
       min(f.ts)                                                     AS oldest_event,
       max(l.ts)                                                     AS newest_event,
       rp.max_size_bytes,
       rp.cleanup_policy,
       rp.tombstone_retention_seconds,
       rp.protect_consumers,
       count(h.partition)::integer                                   AS partitions,
       rp.updated_at,
       'partition'::text                                             AS limits_per
  FROM streamd.retention_policies rp
  LEFT JOIN streamd.stream_partitions h ON h.stream_name = rp.stream_name
  LEFT JOIN LATERAL (SELECT e."timestamp" AS ts FROM streamd.events e
                      WHERE e.stream_name = h.stream_name AND e.partition = h.partition
                        AND e."offset" >= h.log_start_offset
                      ORDER BY e."offset" LIMIT 1) f ON true
  LEFT JOIN LATERAL (SELECT e."timestamp" AS ts FROM streamd.events e
                      WHERE e.stream_name = h.stream_name AND e.partition = h.partition
                        AND e."offset" >= h.log_start_offset AND e."offset" < h.next_offset
                      ORDER BY e."offset" DESC LIMIT 1) l ON true
 GROUP BY rp.stream_name;
