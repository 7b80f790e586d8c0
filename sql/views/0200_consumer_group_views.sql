-- Seed 003's consumer_group_status, per partition (offsets are per partition since
-- handover moves them between members): the committed offset, the log end, the lag
-- (log end - committed, G5; the whole retained log when nothing is committed), and the
-- owner's heartbeat, and the reason a partition is not progressing (NULL when it is):
--   paused            the group paused the partition
--   unowned           no member owns it
--   owner_stale       its owner is gone or missed its session timeout (also while an
--                     in-flight commit of an owner that is gone holds it: it moves
--                     to pending_owner when that transaction ends)
--   fenced            its owner's registration has another member epoch than the
--                     ownership, so the owner's commits are refused (G1)
--   behind_log_start  the committed offset is below the log start: retention deleted
--                     records the group had not read; the next fetch applies the
--                     group's offset reset policy
-- Every partition of the group's stream has a row, also one the group has not been
-- assigned yet (the stream grew while no member was there to rebalance): its lag is
-- the group's too, and it shows as unowned. is_stale is true when the owner missed its
-- session timeout or is gone (no registration), false when there is no owner.
-- From head rows and keys only: no scan of events. It reads as the caller
-- (security_invoker): a tenant role sees its own groups only (migration 0063). Members that own no partition have
-- a row of their own (below): readers of per-partition rows filter on partition IS NOT
-- NULL.
CREATE OR REPLACE VIEW streamd.consumer_group_status WITH (security_invoker = true) AS
SELECT g.stream_name,
       g.group_id,
       h.partition,
       cp.owner_id                                              AS consumer_id,
       cp.owner_epoch                                           AS member_epoch,
       cp.target_id                                             AS pending_owner,
       coalesce(cp.paused, false)                               AS paused,
       co."offset"                                              AS current_offset,
       h.log_start_offset,
       h.next_offset                                            AS stream_head,
       h.next_offset - greatest(coalesce(co."offset", h.log_start_offset), h.log_start_offset) AS lag,
       cr.last_heartbeat,
       CASE
           WHEN cp.owner_id IS NULL THEN false
           WHEN cr.consumer_id IS NULL THEN true
           ELSE cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' < now()
       END                                                      AS is_stale,
       CASE
           WHEN cp.paused THEN 'paused'
           WHEN cp.owner_id IS NULL THEN 'unowned'
           WHEN cr.consumer_id IS NULL
             OR cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' < now() THEN 'owner_stale'
           WHEN cr.member_epoch <> cp.owner_epoch THEN 'fenced'
           WHEN co."offset" < h.log_start_offset THEN 'behind_log_start'
       END                                                      AS reason
  FROM streamd.consumer_groups g
  JOIN streamd.stream_partitions h ON h.stream_name = g.stream_name
  LEFT JOIN streamd.consumer_partitions cp
    ON cp.stream_name = g.stream_name AND cp.group_id = g.group_id AND cp.partition = h.partition
  LEFT JOIN streamd.consumer_offsets co
    ON co.stream_name = g.stream_name AND co.group_id = g.group_id AND co.partition = h.partition
  LEFT JOIN streamd.consumer_registrations cr
    ON cr.stream_name = cp.stream_name AND cr.group_id = cp.group_id AND cr.consumer_id = cp.owner_id
UNION ALL
-- Seed 003's rows are per registration: a member that owns no partition (more members
-- than partitions, or one waiting for a partition to be handed over) has a row too,
-- with partition, offsets and lag NULL and reason 'owns_nothing'.
SELECT cr.stream_name,
       cr.group_id,
       NULL::integer,
       cr.consumer_id,
       cr.member_epoch,
       NULL::text,
       false,
       NULL::bigint,
       NULL::bigint,
       NULL::bigint,
       NULL::bigint,
       cr.last_heartbeat,
       cr.last_heartbeat + cr.session_timeout_ms * interval '1 millisecond' < now(),
       'owns_nothing'
  FROM streamd.consumer_registrations cr
 WHERE NOT EXISTS (SELECT 1 FROM streamd.consumer_partitions cp
                    WHERE cp.stream_name = cr.stream_name AND cp.group_id = cr.group_id AND cp.owner_id = cr.consumer_id);

-- One row per group: members, partitions, owned and pending partitions, total lag.
CREATE OR REPLACE VIEW streamd.consumer_group_summary WITH (security_invoker = true) AS
SELECT g.stream_name,
       g.group_id,
       g.group_epoch,
       (SELECT count(*) FROM streamd.consumer_registrations cr
         WHERE cr.stream_name = g.stream_name AND cr.group_id = g.group_id)           AS members,
       (SELECT count(*) FROM streamd.consumer_group_status s
         WHERE s.stream_name = g.stream_name AND s.group_id = g.group_id AND s.partition IS NOT NULL) AS partitions,
       (SELECT count(*) FROM streamd.consumer_group_status s
         WHERE s.stream_name = g.stream_name AND s.group_id = g.group_id AND s.pending_owner IS NOT NULL) AS pending_moves,
       (SELECT coalesce(sum(s.lag), 0) FROM streamd.consumer_group_status s
         WHERE s.stream_name = g.stream_name AND s.group_id = g.group_id)             AS lag,
       g.updated_at
  FROM streamd.consumer_groups g;
