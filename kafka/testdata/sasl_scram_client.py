"""The Python Kafka clients against streamd with SASL SCRAM: run by
kafka/sasl_python_test.go (TestPythonSCRAM).

CLIENT is confluent (Debian's python3-confluent-kafka, on librdkafka: SaslHandshake
v1 + SaslAuthenticate) or kafka-python (python3-kafka, its own SCRAM, over
SaslHandshake v0's bare frames). Environment: BOOTSTRAP, TOPIC, GROUP, MECHANISM,
WRITER/WRITER_PASSWORD, READER/READER_PASSWORD, BAD_PASSWORD. A wrong password is
refused; the writer produces 5 records to partition 0; the reader consumes them in a
group and commits. Prints one line per check; exits non-zero on the first that fails.
"""
import os
import sys

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient


def conf(user, password, **extra):
    c = {
        "bootstrap.servers": os.environ["BOOTSTRAP"],
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": os.environ["MECHANISM"],
        "sasl.username": user,
        "sasl.password": password,
    }
    c.update(extra)
    return c


def kafka_python():
    from kafka import KafkaConsumer, KafkaProducer

    topic, n = os.environ["TOPIC"], 5

    def kw(user, password):
        return dict(bootstrap_servers=os.environ["BOOTSTRAP"], security_protocol="SASL_PLAINTEXT",
                    sasl_mechanism=os.environ["MECHANISM"], sasl_plain_username=user, sasl_plain_password=password)

    try:
        KafkaProducer(api_version_auto_timeout_ms=5000, **kw(os.environ["READER"], os.environ["BAD_PASSWORD"])).close()
        print("FAIL: a wrong password connected")
        return 1
    except Exception as e:  # kafka-python reports it as no broker available
        print("bad password refused:", type(e).__name__, e)

    p = KafkaProducer(acks="all", **kw(os.environ["WRITER"], os.environ["WRITER_PASSWORD"]))
    for i in range(n):
        p.send(topic, key=b"k%d" % i, value=b"scram-%d" % i, partition=0).get(timeout=30)
    p.close()
    print("produced", n)

    c = KafkaConsumer(topic, group_id=os.environ["GROUP"], auto_offset_reset="earliest", enable_auto_commit=False,
                      consumer_timeout_ms=20000, **kw(os.environ["READER"], os.environ["READER_PASSWORD"]))
    got = []
    for m in c:
        got.append(m.value.decode())
        if len(got) >= n:
            break
    if got != ["scram-%d" % i for i in range(n)]:
        print("FAIL: consumed", got)
        return 1
    c.commit()
    c.close()
    print("consumed", len(got), "committed")
    return 0


def main():
    if os.environ.get("CLIENT") == "kafka-python":
        return kafka_python()
    topic, n = os.environ["TOPIC"], 5

    # A wrong password: metadata cannot be had.
    bad = AdminClient(conf(os.environ["READER"], os.environ["BAD_PASSWORD"]))
    try:
        bad.list_topics(timeout=5)
        print("FAIL: a wrong password listed topics")
        return 1
    except KafkaException as e:
        print("bad password refused:", e)

    errors = []
    p = Producer(conf(os.environ["WRITER"], os.environ["WRITER_PASSWORD"], **{"enable.idempotence": True}))
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"scram-%d" % i, partition=0,
                  on_delivery=lambda err, msg: errors.append(err) if err else None)
    left = p.flush(30)
    if left or errors:
        print("FAIL: produce:", left, "left,", errors)
        return 1
    print("produced", n)

    c = Consumer(conf(os.environ["READER"], os.environ["READER_PASSWORD"], **{
        "group.id": os.environ["GROUP"], "auto.offset.reset": "earliest", "enable.auto.commit": False}))
    c.subscribe([topic])
    got = []
    for _ in range(300):
        if len(got) >= n:
            break
        m = c.poll(0.1)
        if m is None:
            continue
        if m.error():
            print("FAIL: consume:", m.error())
            return 1
        got.append(m.value().decode())
    if got != ["scram-%d" % i for i in range(n)]:
        print("FAIL: consumed", got)
        return 1
    c.commit(asynchronous=False)
    committed = c.committed(c.assignment(), timeout=10)
    c.close()
    print("consumed", len(got), "committed", sorted((tp.partition, tp.offset) for tp in committed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
