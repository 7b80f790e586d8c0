"""A produce, group consume and commit round trip with one of the Python Kafka clients
against streamd's Kafka listener (TestPythonClients, make test-kafka-clients).

    python3 python_clients.py CLIENT BOOTSTRAP TOPIC GROUP N

CLIENT is confluent (confluent-kafka, on librdkafka) or kafka-python. It produces N
records (keys k0..k{N-1}, values v0..., a header h=x) to TOPIC, consumes them all in
GROUP from the earliest offset committing synchronously, closes, and then asks a new
member of GROUP for its committed offsets. It prints one JSON object: the values
consumed and the committed offset of each partition. Any error exits non-zero.
"""

import json
import sys
import time

DEADLINE = 60


def confluent(bootstrap, topic, group, n):
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    errors = []

    def delivered(err, _msg):
        if err is not None:
            errors.append(err)

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.codec": "lz4",
                  "linger.ms": 5})
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"x")], on_delivery=delivered)
        p.poll(0)
    if p.flush(DEADLINE) != 0 or errors:
        raise RuntimeError("produce: %d left, errors %s" % (len(p), errors))

    conf = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    c = Consumer(conf)
    c.subscribe([topic])
    values = set()
    end = time.time() + DEADLINE
    while len(values) < n and time.time() < end:
        msg = c.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            raise KafkaException(msg.error())
        if msg.headers() != [("h", b"x")] or msg.key() != b"k" + msg.value()[1:]:
            raise RuntimeError("record %s: key %r headers %r" % (msg.value(), msg.key(), msg.headers()))
        values.add(msg.value().decode())
        c.commit(message=msg, asynchronous=False)
    parts = [TopicPartition(topic, tp.partition) for tp in c.assignment()]
    c.close()

    c = Consumer(conf)
    committed = {tp.partition: tp.offset for tp in c.committed(parts, timeout=10)}
    c.close()
    return values, committed


def kafka_python(bootstrap, topic, group, n):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="gzip", linger_ms=5)
    futures = [p.send(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"x")]) for i in range(n)]
    for f in futures:
        f.get(timeout=DEADLINE)
    p.close()

    def consumer():
        return KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                             enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=500)

    c = consumer()
    c.subscribe([topic])
    values = set()
    end = time.time() + DEADLINE
    while len(values) < n and time.time() < end:
        for _tp, msgs in c.poll(timeout_ms=500).items():
            for msg in msgs:
                if msg.headers != [("h", b"x")] or msg.key != b"k" + msg.value[1:]:
                    raise RuntimeError("record %s: key %r headers %r" % (msg.value, msg.key, msg.headers))
                values.add(msg.value.decode())
        c.commit()
    parts = sorted(tp.partition for tp in c.assignment())
    c.close()

    c = consumer()
    committed = {q: c.committed(TopicPartition(topic, q)) for q in parts}
    c.close()
    return values, committed


def main():
    client, bootstrap, topic, group, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    run = {"confluent": confluent, "kafka-python": kafka_python}[client]
    values, committed = run(bootstrap, topic, group, n)
    print(json.dumps({"values": sorted(values), "committed": {str(k): v for k, v in committed.items()}}))


if __name__ == "__main__":
    main()
