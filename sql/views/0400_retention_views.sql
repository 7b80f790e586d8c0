-- Monitoring views of retention and group progress. Both are computed from head rows,
-- keys and primary-key probes (two per partition), never by scanning events.

-- Seed 003's retention_policy_status (stream_name, max_age_seconds, max_event_count,
-- enabled, current_event_count, oldest_event, newest_event), plus streamd's policy
-- columns. current_event_count counts retained offsets (next_offset -
-- log_start_offset per partition): exact for a log that is not compacted, an upper
-- bound for one that is. oldest_event and newest_event are the timestamps of the first
-- and last retained events.
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
       rp.updated_at
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

-- consumer_group_status (sql/views/0200_consumer_group_views.sql) with the reason a
-- partition is not progressing, NULL when it is:
--   paused            the group paused the partition
--   unowned           no member owns it
--   owner_stale       its owner is gone or missed its session timeout
--   fenced            its owner's registration has another member epoch than the
--                     ownership, so the owner's commits are refused (G1)
--   behind_log_start  the committed offset is below the log start: retention deleted
--                     records the group had not read; the next fetch applies the
--                     group's offset reset policy
-- From base tables (not from consumer_group_status) so the two views evolve apart.
CREATE OR REPLACE VIEW streamd.consumer_group_progress AS
SELECT cp.stream_name,
       cp.group_id,
       cp.partition,
       cp.owner_id                                                            AS consumer_id,
       co."offset"                                                            AS current_offset,
       h.log_start_offset,
       h.next_offset                                                          AS stream_head,
       h.next_offset - greatest(coalesce(co."offset", h.log_start_offset), h.log_start_offset) AS lag,
       cr.last_heartbeat,
       coalesce(cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' < now(), false) AS is_stale,
       CASE
           WHEN cp.paused THEN 'paused'
           WHEN cp.owner_id IS NULL THEN 'unowned'
           WHEN cr.consumer_id IS NULL
             OR cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' < now() THEN 'owner_stale'
           WHEN cr.member_epoch <> cp.owner_epoch THEN 'fenced'
           WHEN co."offset" < h.log_start_offset THEN 'behind_log_start'
       END                                                                    AS reason
  FROM streamd.consumer_partitions cp
  JOIN streamd.stream_partitions h ON h.stream_name = cp.stream_name AND h.partition = cp.partition
  LEFT JOIN streamd.consumer_offsets co
    ON co.stream_name = cp.stream_name AND co.group_id = cp.group_id AND co.partition = cp.partition
  LEFT JOIN streamd.consumer_registrations cr
    ON cr.stream_name = cp.stream_name AND cr.group_id = cp.group_id AND cr.consumer_id = cp.owner_id;
