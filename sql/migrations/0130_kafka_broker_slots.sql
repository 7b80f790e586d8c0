-- Several broker identities per instance (issue 19, the end-to-end tail; docs/kafka.md
-- "Brokers"). Kafka clients keep one fetch in flight per broker, keyed by node id: an
-- instance that is one broker answers every partition a client reads from it in one
-- fetch at a time, so a record whose partition wakes while that fetch reads another
-- partition waits for the read, the response and the next fetch. An instance now
-- registers several rows at its address, one per slot (0, 1, ...), each its own node
-- id, and Metadata spreads partition leadership over them: a client keeps one fetch in
-- flight per slot. Node ids stay stable per listener, address and slot; slot 0 keeps
-- the id the address had.
ALTER TABLE streamd.kafka_brokers ADD COLUMN IF NOT EXISTS slot integer NOT NULL DEFAULT 0 CHECK (slot >= 0);
ALTER TABLE streamd.kafka_brokers DROP CONSTRAINT IF EXISTS kafka_brokers_listener_host_port_key;
ALTER TABLE streamd.kafka_brokers DROP CONSTRAINT IF EXISTS kafka_brokers_listener_host_port_slot_key;
ALTER TABLE streamd.kafka_brokers ADD CONSTRAINT kafka_brokers_listener_host_port_slot_key UNIQUE (listener, host, port, slot);
-- The heartbeat of several slots is streamd.kafka_broker_heartbeat_slots; the old
-- kafka_broker_heartbeat keeps its signature (slot 0), so that an instance not yet
-- upgraded keeps its row alive.
