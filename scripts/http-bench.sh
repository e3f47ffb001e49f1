#!/usr/bin/env bash
# Requests per second over loopback through guard-tower and tower-governor:
# the same axum server (one worker thread) with each layer, a non-binding
# quota keyed by client IP, header fields on; wrk (2 threads, 16
# connections) on the other core. The two run in turn ROUNDS times and the
# medians are compared. Installs wrk (Debian package) when missing.
#
#   scripts/http-bench.sh [SECONDS] [ROUNDS]     (10 s and 3 rounds by default)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
rounds=${2:-3}

if ! command -v wrk >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "wrk is missing: install the Debian package wrk, or run as root" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk
fi

cargo build --release --locked -p guard-benches --example http_server
server=target/release/examples/http_server

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pid=""
stop() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; pid=""; }
trap stop EXIT

# Requests per second of one wrk run against LAYER.
measure() {
    local layer=$1 port
    port=$(free_port)
    "$server" "$layer" "$port" >/dev/null &
    pid=$!
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:$port/hello/x" && break
        sleep 0.1
    done
    # Every answer must be a 200: a 429 would measure the refusal path.
    local non_2xx
    non_2xx=$(wrk -t2 -c16 -d"${seconds}s" "http://127.0.0.1:$port/hello/x" | tee /tmp/wrk.$$ | awk '/Non-2xx/ {print $NF}')
    if [ -n "$non_2xx" ]; then
        echo "$layer answered $non_2xx non-2xx responses" >&2
        exit 1
    fi
    awk '/Requests\/sec/ {print $2}' /tmp/wrk.$$
    rm -f /tmp/wrk.$$
    stop
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A runs
for _ in $(seq "$rounds"); do
    for layer in none guard governor; do
        runs[$layer]+="$(measure "$layer") "
    done
done

echo
echo "| server (axum, 1 worker; wrk -t2 -c16, ${seconds}s x ${rounds}) | requests/s (median) | runs |"
echo "|---|---|---|"
for layer in none guard governor; do
    m=$(tr ' ' '\n' <<<"${runs[$layer]}" | grep . | median)
    echo "| $layer | $m | ${runs[$layer]}|"
done
g=$(tr ' ' '\n' <<<"${runs[guard]}" | grep . | median)
p=$(tr ' ' '\n' <<<"${runs[governor]}" | grep . | median)
awk -v g="$g" -v p="$p" 'BEGIN { printf "\nguard-tower / tower-governor, requests per second: %.2f (goal: time per request at most 1.0 of tower-governor, i.e. this at least 1.0)\n", g / p }'
