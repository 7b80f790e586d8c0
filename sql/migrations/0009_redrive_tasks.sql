-- Background redrive of dead-letter queues, run by streamd serve's leader at a bounded
-- rate: each task moves up to max_messages (0: until the queue is empty) back to their
-- origin queues, counting what it moved in the same transaction as each move.
CREATE TABLE streamd.redrive_tasks (
    dlq          text             NOT NULL,
    id           bigint           GENERATED ALWAYS AS IDENTITY,
    rate         double precision NOT NULL DEFAULT 0 CHECK (rate >= 0),   -- messages per second, 0: unbounded
    max_messages bigint           NOT NULL DEFAULT 0 CHECK (max_messages >= 0),
    moved        bigint           NOT NULL DEFAULT 0,
    status       text             NOT NULL DEFAULT 'pending'
                                  CHECK (status IN ('pending', 'running', 'done', 'failed', 'canceled')),
    error        text,
    created_by   text,
    created_at   timestamptz      NOT NULL DEFAULT now(),
    updated_at   timestamptz      NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    PRIMARY KEY (dlq, id)
);
CREATE INDEX redrive_tasks_open ON streamd.redrive_tasks (created_at) WHERE status IN ('pending', 'running');
