-- Records as Kafka clients see them (issue 19).
--
-- Headers: an ordered list whose keys may repeat and whose values are bytes (or
-- NULL). metadata (a JSON object of strings) cannot hold that without loss, so a
-- record appended with such headers keeps them in two parallel arrays; metadata stays
-- what the Go client's string headers are stored in. Both NULL: no headers.
ALTER TABLE streamd.events
    ADD COLUMN header_keys   text[],
    ADD COLUMN header_values bytea[],
    ADD CONSTRAINT events_headers_pair CHECK (
        (header_keys IS NULL AND header_values IS NULL)
        OR cardinality(header_keys) = cardinality(header_values));

-- value_format says what a stream's values are: 'any' (JSON in data or bytes in
-- data_bytes, as the writer chose) or 'json' (a Kafka producer's value must be JSON,
-- and is stored in data, so SQL can query it).
ALTER TABLE streamd.streams
    ADD COLUMN value_format text NOT NULL DEFAULT 'any' CHECK (value_format IN ('any', 'json'));

-- Idempotent producers (Kafka's InitProducerId and per-partition sequences): a
-- producer id and its epoch, and per partition the last sequence appended and the
-- last few batches, so a retried batch is recognised and answered with its original
-- offset instead of being appended twice.
CREATE SEQUENCE streamd.producer_id_seq AS bigint MINVALUE 1000 START 1000;

CREATE TABLE streamd.producers (
    producer_id      bigint      PRIMARY KEY,
    epoch            smallint    NOT NULL DEFAULT 0,
    transactional_id text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- L5: the key includes stream_name.
CREATE TABLE streamd.producer_partitions (
    stream_name   text        NOT NULL,
    partition     integer     NOT NULL,
    producer_id   bigint      NOT NULL,
    epoch         smallint    NOT NULL,
    last_sequence integer     NOT NULL,  -- the sequence of the last record appended
    -- The last (at most 5) batches appended, oldest first: first and last sequence,
    -- first offset and log time. A retry of one of them is a duplicate.
    batch_first   integer[]   NOT NULL,
    batch_last    integer[]   NOT NULL,
    batch_offset  bigint[]    NOT NULL,
    batch_ts      timestamptz[] NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_name, partition, producer_id),
    FOREIGN KEY (stream_name, partition) REFERENCES streamd.stream_partitions (stream_name, partition) ON DELETE CASCADE
);
