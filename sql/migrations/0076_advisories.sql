-- The advisory stream (issue 20, point 4; docs/advisories.md): streamd writes its
-- operational events (a dead letter, a member expired or fenced, a rebalance,
-- retention deleting what a live group had not read, an offset reset, the tailer
-- falling back to polling or losing its slot, a leader change) to a stream of its own,
-- streamd.advisories, which any consumer group, the CLI and Kafka clients read like
-- any other stream. The functions that write them are in
-- sql/functions/0150_advisories.sql.
--
-- One partition: advisories are rare (per rebalance, per expiry, per dead letter), and
-- one partition gives readers one order. Kept for 7 days by a retention policy (an
-- operator may change it like any stream's). The rows are written directly, not
-- through create_stream: a migration runs before the re-applied functions layer.
-- ON CONFLICT DO NOTHING: a user who made a stream of that name keeps it as it is.
INSERT INTO streamd.streams (stream_name, partitions) VALUES ('streamd.advisories', 1)
ON CONFLICT (stream_name) DO NOTHING;
INSERT INTO streamd.stream_partitions (stream_name, partition) VALUES ('streamd.advisories', 0)
ON CONFLICT DO NOTHING;
INSERT INTO streamd.retention_policies (stream_name, max_age_seconds) VALUES ('streamd.advisories', 604800)
ON CONFLICT (stream_name) DO NOTHING;
-- The policy's JSON face (kept in step by triggers once the functions layer exists;
-- written here for a fresh database, where it does not yet), as retention_config_json
-- renders the policy above.
INSERT INTO streamd.stream_configurations (stream_name, retention_config)
VALUES ('streamd.advisories', '{"enabled": true, "maxAge": "7.00:00:00", "cleanupPolicy": "delete",
                                "tombstoneRetention": "1.00:00:00", "protectConsumers": false}')
ON CONFLICT (stream_name) DO NOTHING;
