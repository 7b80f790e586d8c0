-- Queues carry binary payloads as the log does (issue 20, point 7): data jsonb (what
-- the seeds use, queryable from SQL) or data_bytes bytea (opaque values: the Kafka
-- front door, protobuf), exactly one of the two. The unused column costs one bit of
-- the null bitmap. Every existing row has data, so the constraint validates.
ALTER TABLE streamd.messages ADD COLUMN data_bytes bytea;
ALTER TABLE streamd.messages ALTER COLUMN data DROP NOT NULL;
ALTER TABLE streamd.messages ADD CONSTRAINT messages_one_payload CHECK ((data IS NULL) <> (data_bytes IS NULL)) NOT VALID;
ALTER TABLE streamd.messages VALIDATE CONSTRAINT messages_one_payload;
