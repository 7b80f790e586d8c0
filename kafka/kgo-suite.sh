#!/usr/bin/env bash
# franz-go's own pkg/kgo test suite against streamd serve's Kafka listener
# (make test-kafka-franz-go). Starts a streamd serve of its own on loopback, runs the
# suite with KGO_SEEDS pointing at it (replication factor 1), prints the pass, fail
# and skip counts and every failing test with the first lines it logged, and stops
# serve. Transaction tests are skipped: streamd has no transactions (docs/kafka.md).
# Kafka's default compression.type is "producer": a consumer gets the batches the
# producer compressed (snappy: franz-go's default), and the suite's compression tests
# expect that. streamd keeps records, not batches, so the serve compresses fetches of
# the topics that set nothing with snappy (--kafka-compression).
# A second serve with a token (SASL) on the next ports runs the suite's SCRAM tests
# (KGO_TEST_SCRAM_SEEDS, KGO_TEST_SCRAM: the admin principal and its token) and its
# OAUTHBEARER test (KGO_TEST_OAUTH_SEEDS; it sends unsecured JWTs, which that serve
# accepts with --kafka-sasl-oauthbearer-unsecured, as Kafka's default handler does:
# docs/kafka.md, Security).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
port=${STREAMD_KGO_PORT:-19192}
http=${STREAMD_KGO_HTTP_PORT:-19193}
sasl_port=${STREAMD_KGO_SASL_PORT:-19194}
sasl_http=${STREAMD_KGO_SASL_HTTP_PORT:-19195}
sasl_token=kgo-suite-admin-token-0123456789
records=${KGO_TEST_RECORDS:-5000}
state=${STREAMD_STATE_DIR:-.state}
mkdir -p "$state" bin
$GO build -o bin/streamd ./cmd/streamd
bin/streamd serve --auth-disabled --http-addr "127.0.0.1:$http" --kafka-addr "127.0.0.1:$port" \
	--kafka-compression snappy --retention-streams none >"$state/kgo-suite-serve.log" 2>&1 &
serve=$!
bin/streamd serve --auth-token "$sasl_token" --http-addr "127.0.0.1:$sasl_http" --kafka-addr "127.0.0.1:$sasl_port" \
	--kafka-sasl-oauthbearer-unsecured --retention-streams none >"$state/kgo-suite-serve-sasl.log" 2>&1 &
sasl_serve=$!
trap 'kill "$serve" "$sasl_serve" 2>/dev/null; wait "$serve" "$sasl_serve" 2>/dev/null || true' EXIT
for p in "$port" "$sasl_port"; do
	for _ in $(seq 100); do
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break
		sleep 0.2
	done
done
out="$state/kgo-suite.json"
KGO_SEEDS="127.0.0.1:$port" KGO_TEST_SCRAM_SEEDS="127.0.0.1:$sasl_port" KGO_TEST_OAUTH_SEEDS="127.0.0.1:$sasl_port" KGO_TEST_SCRAM="admin:$sasl_token:512" KGO_TEST_RF=1 KGO_TEST_RECORDS=$records KGO_LOG_LEVEL=none \
	$GO test -count=1 -timeout "${KGO_SUITE_TIMEOUT:-20m}" -json -skip 'Txn|Transact' \
	github.com/twmb/franz-go/pkg/kgo >"$out" 2>&1 || true
$GO run ./kafka/internal/kgosummary <"$out" | tee "$state/kgo-suite.txt"
