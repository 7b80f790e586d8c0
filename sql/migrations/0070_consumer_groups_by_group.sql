-- The Kafka listener's group authorization (issue 19, security) reads a group's
-- streams on every group request (consumergroup.Classic.GroupStreams): by group id,
-- which the primary key (stream_name, group_id) cannot serve.
CREATE INDEX consumer_groups_group_id ON streamd.consumer_groups (group_id);
