-- KIP-848 members at the level of the Kafka group (issue 19, multi-topic and regex
-- subscriptions). The functions are in sql/functions/0225_kafka_consumer_members.sql;
-- the Go side is consumergroup.Classic.ConsumerHeartbeat (consumergroup/kip848.go).
--
-- A KIP-848 member has ONE member epoch for its whole subscription, which may name
-- several topics or a regex. streamd's native groups are per stream (each
-- (stream, group) has its own group epoch, and a membership's epoch is the fence token
-- of its ownership rows). So the Kafka member lives here, with its Kafka member epoch
-- and its subscription, and it holds one native membership per stream it subscribes to
-- (consumer_registrations rows under the same consumer id, each with its native
-- epoch). An OffsetCommit with the Kafka epoch is checked against this row, then fenced
-- per partition by the native ownership row at the native epoch of that stream's
-- membership (kafka_group_commit): G1 is the native fence, unchanged.

-- The group-level epoch counter: every KIP-848 join takes the next value as its
-- member epoch, so a member id that joins again never reuses an epoch.
CREATE TABLE IF NOT EXISTS streamd.kafka_consumer_groups (
    group_id    text        PRIMARY KEY,
    group_epoch integer     NOT NULL DEFAULT 0 CHECK (group_epoch >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per KIP-848 member. subscribed_topics and subscribed_regex are the
-- subscription (the regex, re2 as Kafka's, matches whole topic names and is resolved
-- on every heartbeat, so topics created later join the subscription). The member's
-- session is this row's; its native memberships are heartbeated with it.
CREATE TABLE IF NOT EXISTS streamd.kafka_consumer_members (
    group_id             text        NOT NULL REFERENCES streamd.kafka_consumer_groups (group_id) ON DELETE CASCADE,
    member_id            text        NOT NULL,
    member_epoch         integer     NOT NULL CHECK (member_epoch > 0),
    instance_id          text,
    subscribed_topics    text[]      NOT NULL DEFAULT '{}',
    subscribed_regex     text,
    session_timeout_ms   integer     NOT NULL CHECK (session_timeout_ms > 0),
    rebalance_timeout_ms integer     NOT NULL CHECK (rebalance_timeout_ms > 0),
    joined_at            timestamptz NOT NULL,
    last_heartbeat       timestamptz NOT NULL,
    PRIMARY KEY (group_id, member_id)
);

-- Tenant scope as the other Kafka group tables (migration 0067).
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['kafka_consumer_groups', 'kafka_consumer_members'] LOOP
        EXECUTE format('ALTER TABLE streamd.%I ADD COLUMN IF NOT EXISTS tenant_id text DEFAULT nullif(current_setting(''streamd.tenant_id'', true), '''')', t);
        EXECUTE format('ALTER TABLE streamd.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY tenant_isolation ON streamd.%I
            USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))
            WITH CHECK ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))', t);
    END LOOP;
END;
$$;
