-- Leadership of streamd's coordinator jobs, and the record of their runs.
--
-- A lease names its holder and an epoch that grows with every change of holder; a
-- holder renews it before it expires. Work done on behalf of a leader checks
-- (name, holder, epoch) in SQL, so a deposed leader cannot act (fencing).
CREATE TABLE streamd.leader_leases (
    name        text        PRIMARY KEY,
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    renewed_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);

-- One row per job per schedule slot: the primary key makes each slot run at most once
-- across all instances, even across a change of leader.
CREATE TABLE streamd.coordinator_runs (
    job         text        NOT NULL,
    slot        bigint      NOT NULL,  -- floor(epoch seconds / interval seconds)
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    error       text,
    PRIMARY KEY (job, slot)
);
