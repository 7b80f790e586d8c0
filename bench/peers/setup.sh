#!/usr/bin/env bash
# Installs the peers' servers that `make bench-peers` starts on loopback: Debian's
# nats-server (NATS JetStream) and redis-server (Redis Streams). Watermill's SQL
# Pub/Sub needs no server of its own: it uses the project's PostgreSQL.
# Idempotent: does nothing when both binaries are on PATH.
set -euo pipefail

missing=()
command -v nats-server >/dev/null 2>&1 || missing+=(nats-server)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
	SUDO="sudo"
fi
echo "bench/peers/setup.sh: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
# The packages' service scripts may try to start system-wide servers; the bench never
# uses them (it starts its own on free loopback ports with data in temp dirs).
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
