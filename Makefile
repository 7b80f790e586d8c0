# streamd. The two commands a fresh machine needs: `make run` and `make test`.
# With no STREAMD_DATABASE_URL, both start (or reuse) the user's private PostgreSQL
# cluster (internal/localpg; STREAMD_STATE_DIR and STREAMD_PG_PORT choose another);
# `make db-stop` stops it.

GO        ?= go
GOFLAGS   ?=
TEST_TIMEOUT ?= 20m
STREAMD   := $(GO) run ./cmd/streamd

# (test-prometheus installs Debian's prometheus package when missing.)
.PHONY: run test test-kcat test-kafka-clients test-kafka-franz-go fuzz-kafka test-prometheus test-rabbitmq test-race db-start db-stop db-url migrate build vet fmt bench bench-full bench-latency bench-peers bench-queue bench-queue-layouts soak soak-groups soak-queue

# Local development: without STREAMD_AUTH_TOKEN or STREAMD_AUTH_TOKEN_FILE the API
# runs with authentication disabled (it listens on 127.0.0.1 unless
# STREAMD_HTTP_ADDR says otherwise). Kafka clients connect to 127.0.0.1:9092
# (STREAMD_KAFKA_ADDR); with a token they authenticate with SASL (username admin,
# password the token; docs/kafka.md "Security").
# The built binary, not `go run`: Ctrl-C reaches streamd itself, which stops cleanly
# and exits 0 (go run exited 1, and a SIGINT to it alone left the server running).
run: build
	exec ./bin/streamd serve $(if $(STREAMD_AUTH_TOKEN)$(STREAMD_AUTH_TOKEN_FILE),,--auth-disabled) --kafka-addr $${STREAMD_KAFKA_ADDR:-127.0.0.1:9092}

build:
	$(GO) build -o bin/streamd ./cmd/streamd

# Start (or reuse) the database first, so a missing PostgreSQL fails here with a clear
# message rather than in every test package at once.
test: db-start
	$(GO) vet ./...
	$(GO) test $(GOFLAGS) -count=1 -timeout $(TEST_TIMEOUT) ./...

test-race: db-start
	$(GO) test $(GOFLAGS) -race -count=1 -timeout 30m ./...

db-start:
	$(STREAMD) db start

db-stop:
	$(STREAMD) db stop

db-url:
	@$(STREAMD) db url

migrate:
	$(STREAMD) migrate

vet:
	$(GO) vet ./...

fmt:
	gofmt -l -w $$(git ls-files '*.go')

bench: db-start
	$(GO) run ./bench/cmd/streamd-bench -suite quick

bench-full: db-start
	$(GO) run ./bench/cmd/streamd-bench -suite full

# Longer randomized runs, outside `make test`.
soak: soak-groups soak-queue

# Consumer-group invariants with random joins, leaves and kills (random seed, logged;
# STREAMD_SOAK_DURATION, default 2m): in-process members (TestGroupInvariants), then
# child processes stopped with SIGTERM, killed with SIGKILL and frozen with SIGSTOP
# (TestChildChaos).
soak-groups: db-start
	STREAMD_SOAK=1 $(GO) test -count=1 -run 'TestGroupInvariants|TestChildChaos' -timeout $${STREAMD_SOAK_TIMEOUT:-3h} ./consumergroup/

# The queue table under churn: dead tuples and table size stay bounded. Run alone: it
# measures the whole table. STREAMD_SOAK_DURATION (default 3m; the issue's figure is
# 30m), STREAMD_SOAK_TIMEOUT (go test's -timeout, default 3h) for either soak.
soak-queue: db-start
	STREAMD_SOAK=1 STREAMD_SOAK_DURATION=$${STREAMD_SOAK_DURATION:-3m} $(GO) test -count=1 -timeout $${STREAMD_SOAK_TIMEOUT:-3h} -run TestSoakTableStaysBounded -v ./messages/

# Queue send+receive+ack against a raw SKIP LOCKED drain, a pgmq-style loop and the
# same queue as FIFO, a receive behind 100,000 delayed messages, then send+receive+ack
# phase by phase on one connection (BenchmarkQueuePhases).
bench-queue: db-start
	$(GO) test -count=1 -run '^$$' -bench 'BenchmarkQueue(Throughput|LongPollLatency|DelayedHead)' -benchtime 5x ./messages/
	$(GO) test -count=1 -run '^$$' -bench BenchmarkQueuePhases -benchtime 300x ./messages/

# The quick suite's queue case over storage layouts written as bare statements, 5
# rounds (issue 22; bench/RESULTS.md, "Issue 22, session 17"). About 70 s.
bench-queue-layouts: db-start
	$(GO) test -count=1 -timeout 30m -run '^$$' -bench BenchmarkQueueLayouts -benchtime 5x ./messages/

# librdkafka (Debian's kcat, installed when missing and apt-get is usable) produces and
# consumes through the Kafka listener, also with SASL PLAIN (TestKcatSASLPlain). make
# test runs the same tests when kcat is there.
test-kcat: db-start
	@command -v kcat >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends kcat >/dev/null; } || { echo "need Debian's kcat package"; exit 1; }
	STREAMD_KCAT_TEST=1 $(GO) test -count=1 -run TestKcat -v ./kafka/

# The Python Kafka clients (Debian's python3-confluent-kafka and python3-kafka,
# installed when missing and apt-get is usable): produce, group consume and commit
# (TestPythonClients), and SASL SCRAM with confluent-kafka (TestPythonSCRAM). The Go
# clients (franz-go, sarama, kafka-go) run in make test.
test-kafka-clients: db-start
	@/usr/bin/python3 -c 'import confluent_kafka, kafka' 2>/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-confluent-kafka python3-kafka >/dev/null; } || { echo "need Debian's python3-confluent-kafka and python3-kafka"; exit 1; }
	STREAMD_KAFKA_CLIENTS_TEST=1 $(GO) test -count=1 -run 'TestPython' -v ./kafka/

# franz-go's own pkg/kgo integration suite against streamd serve (docs/kafka.md records
# the results). Long: up to KGO_SUITE_TIMEOUT (20m).
test-kafka-franz-go: db-start
	./kafka/kgo-suite.sh

# The Kafka frame and record-batch fuzzers (their seed corpora run in make test).
fuzz-kafka:
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRequest$$' -fuzztime $${FUZZTIME:-60s} ./kafka/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeBatch$$' -fuzztime $${FUZZTIME:-60s} ./kafka/

# A real Prometheus scrapes streamd serve's /metrics (installs Debian's prometheus when
# missing and apt-get is usable).
test-prometheus: db-start
	@command -v prometheus >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >/dev/null; } || { echo "need Debian's prometheus package"; exit 1; }
	STREAMD_PROMETHEUS_TEST=1 $(GO) test -count=1 -run TestPrometheusScrapes -v ./cmd/streamd/

# The forwarder's RabbitMQ integration test: installs Debian's rabbitmq-server when
# missing (as root), runs a private node on 127.0.0.1:25672 (data in .state/rabbitmq),
# stops it after. STREAMD_AMQP_URL set: uses that broker instead.
test-rabbitmq: db-start
	./forward/rabbitmq-test.sh

# Peers in the same run as streamd (bench/PEERS.md): installs nats-server and
# redis-server when missing, starts them on loopback, stops them afterwards.
bench-peers: db-start
	bash bench/peers/setup.sh
	cd bench/peers && $(GO) run .

# End-to-end latency at ~1,000 events/s: the tailer, LISTEN/NOTIFY and polling in one
# run, on a private cluster with fsync off (bench/latency_scenario.go; bench-full runs
# it on the project's cluster).
bench-latency: db-start
	STREAMD_BENCH_LATENCY=$${STREAMD_BENCH_LATENCY:-10s} $(GO) test -count=1 -run TestLatencyScenario -v -timeout 20m ./bench/
