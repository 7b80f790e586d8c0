-- Projections (seed 001): a read model's state per (projection type, aggregate), with
-- the last event applied to it, so that applying an event is idempotent: an event at
-- or below the last applied one of the same stream partition changes nothing.
-- Package projection (Store.ApplyTx) writes it inside the caller's transaction; with
-- consumergroup's Batch.CommitTx in the same transaction the state and the group's
-- offset commit together (exactly once).
--
-- Tenant-scoped like events and messages (docs/tenants.md): tenant_id and the same
-- row-level security policy.
CREATE TABLE streamd.projections (
    projection_type      text        NOT NULL CHECK (projection_type <> ''),
    aggregate_id         text        NOT NULL CHECK (aggregate_id <> ''),
    state                jsonb       NOT NULL,
    last_event_id        text        NOT NULL,
    last_event_timestamp timestamptz,
    stream_name          text        NOT NULL,
    partition            integer     NOT NULL CHECK (partition >= 0),
    last_offset          bigint      NOT NULL CHECK (last_offset >= 0),
    tenant_id            text        DEFAULT nullif(current_setting('streamd.tenant_id', true), ''),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection_type, aggregate_id)
);

-- Seed 001's "all projections for an aggregate".
CREATE INDEX projections_aggregate ON streamd.projections (aggregate_id);

ALTER TABLE streamd.projections ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON streamd.projections
    USING ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()))
    WITH CHECK ((SELECT streamd.current_tenant()) IS NULL OR tenant_id = (SELECT streamd.current_tenant()));
