#!/bin/sh
# make test-rabbitmq: runs the forwarder's integration tests (build tag rabbitmq)
# against Debian's rabbitmq-server, started on loopback with a private node name,
# ports, cookie and data directory, and stopped afterwards. Installs the package with
# apt-get when it is missing and we are root. STREAMD_AMQP_URL set: use that broker.
set -eu
GO=${GO:-go}
if [ -n "${STREAMD_AMQP_URL:-}" ]; then
	exec $GO test -count=1 -tags rabbitmq -run . ./forward/
fi
SERVER=/usr/lib/rabbitmq/bin/rabbitmq-server
if [ ! -x "$SERVER" ]; then
	if [ "$(id -u)" = 0 ]; then
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends rabbitmq-server
	else
		echo "rabbitmq-server is not installed: apt-get install rabbitmq-server (as root)" >&2
		exit 1
	fi
fi
STATE=$(pwd)/.state/rabbitmq
rm -rf "$STATE"
mkdir -p "$STATE/home" "$STATE/log" "$STATE/mnesia"
PORT=${STREAMD_RABBITMQ_PORT:-25672}
export RABBITMQ_NODENAME="streamd-test-$$@localhost"
export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODE_PORT="$PORT"
export RABBITMQ_DIST_PORT=$((PORT + 1))
export ERL_EPMD_PORT=$((PORT + 2))
export ERL_EPMD_ADDRESS=127.0.0.1
export RABBITMQ_MNESIA_BASE="$STATE/mnesia"
export RABBITMQ_LOG_BASE="$STATE/log"
export RABBITMQ_ENABLED_PLUGINS_FILE="$STATE/enabled_plugins"
export RABBITMQ_CONFIG_FILE="$STATE/rabbitmq"
echo "[]." > "$RABBITMQ_ENABLED_PLUGINS_FILE"
printf 'listeners.tcp.default = 127.0.0.1:%s\nloopback_users.guest = true\n' "$PORT" > "$STATE/rabbitmq.conf"
HOME="$STATE/home" "$SERVER" > "$STATE/log/server.out" 2>&1 & # HOME: a private Erlang cookie
PID=$!
stop() {
	kill "$PID" 2> /dev/null || true # SIGTERM: the broker halts gracefully
	wait "$PID" 2> /dev/null || true
	epmd -port "$ERL_EPMD_PORT" -kill > /dev/null 2>&1 || true
}
trap stop EXIT INT TERM
# Wait (up to 90s) for the broker to say it is up.
i=0
until grep -q "Server startup complete" "$STATE/log/$RABBITMQ_NODENAME.log" 2> /dev/null; do
	i=$((i + 1))
	if [ "$i" -gt 900 ] || ! kill -0 "$PID" 2> /dev/null; then
		echo "rabbitmq-server did not start; its output:" >&2
		tail -50 "$STATE/log/server.out" >&2
		exit 1
	fi
	sleep 0.1
done
STREAMD_AMQP_URL="amqp://guest:guest@127.0.0.1:$PORT/" $GO test -count=1 -tags rabbitmq -run . ./forward/
