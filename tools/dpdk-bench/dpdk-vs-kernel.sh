#!/usr/bin/env bash
# GET and SET throughput and requests per CPU-second: lavik --network=dpdk (userspace TCP
# over DPDK's af_packet PMD on a veth, and over its tap PMD) against kernel mode (io_uring
# sockets on the same veth), the client in its own network namespace. One lavik worker
# pinned to CPU 0, the client (lavik-bench, one thread) pinned to CPU 1.
#
#   cargo build --release --features dpdk -p lavik -p lavik-bench
#   sudo tools/dpdk-bench/dpdk-vs-kernel.sh [seconds-per-point] [out.csv]
#
# Server CPU share is utime+stime of the whole lavik process (/proc/PID/stat, sampled every
# 100 ms) over the steady part of each point (its first and last second skipped);
# requests per CPU-second = ops/s / that share. A busy-polling DPDK worker burns all of CPU 0 whatever the load, so the per-CPU
# figure is only comparable at saturation. Everything it creates is named lvkb-<pid>-* and
# removed on exit; only the lavik processes it started are killed (by PID).
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-10}
OUT=${2:-/dev/stdout}
KEYS=10000
SIZE=100
CONNS="16 64"
LAVIK=target/release/lavik
BENCH=target/release/lavik-bench
TAG=lvkb-$$
NS_CLI=$TAG-cli
NS_SRV=$TAG-srv
TMP=$(mktemp -d /tmp/$TAG.XXXX)
HZ=$(getconf CLK_TCK)
SERVER_PID=
SAMPLER_PID=

cleanup() {
    if [ -n "$SAMPLER_PID" ]; then kill "$SAMPLER_PID" 2>/dev/null || true; fi
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    ip netns del "$NS_CLI" 2>/dev/null || true
    ip netns del "$NS_SRV" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }
ip netns add "$NS_CLI"
ip netns add "$NS_SRV"
ip -n "$NS_CLI" link set lo up
ip -n "$NS_SRV" link set lo up
# Kernel mode link: a veth pair between the client and server namespaces.
ip link add "$TAG-c" netns "$NS_CLI" type veth peer name "$TAG-s" netns "$NS_SRV"
ip -n "$NS_CLI" addr add 10.98.0.1/24 dev "$TAG-c"
ip -n "$NS_SRV" addr add 10.98.0.2/24 dev "$TAG-s"
ip -n "$NS_CLI" link set "$TAG-c" up
ip -n "$NS_SRV" link set "$TAG-s" up
# The af_packet PMD sees frames as the client's kernel hands them to the veth: without this
# their TCP checksums are left for an offload that never happens. Set for every mode.
ip netns exec "$NS_CLI" ethtool -K "$TAG-c" tx off >/dev/null

# Samples the server's CPU time (utime+stime, all threads) every 100 ms, with wall time.
start_sampler() {
    while kill -0 "$SERVER_PID" 2>/dev/null; do
        # wall time, server process ticks, busy ticks of CPU 0 and CPU 1 (no idle/iowait)
        echo "$(date +%s.%N) $(awk '{print $14 + $15}' "/proc/$SERVER_PID/stat" 2>/dev/null || echo 0)" \
            "$(awk '$1 == "cpu0" || $1 == "cpu1" {printf "%d ", $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat)"
        sleep 0.1
    done >"$TMP/cpu.samples" &
    SAMPLER_PID=$!
}

wait_ping() { # netns host
    for _ in $(seq 200); do
        if ip netns exec "$1" timeout 1 redis-cli -h "$2" PING 2>/dev/null | grep -q PONG; then return 0; fi
        sleep 0.05
    done
    echo "server at $2 never answered" >&2; return 1
}

bench() { # host args...
    local host=$1; shift
    ip netns exec "$NS_CLI" taskset -c 1 "$BENCH" -s "$host" -p 6379 -t 1 --hide-histogram \
        --hide-progress --key-minimum=1 --key-maximum=$KEYS -d $SIZE \
        --json-out-file="$TMP/run.json" "$@" >/dev/null
}

measure() { # mode host
    local mode=$1 host=$2
    # Fill every key once so GETs hit.
    bench "$host" --ratio=1:0 --key-pattern=P:P -c 16 --requests=allkeys --pipeline=16
    for cmd in get set; do
        local ratio=0:1; [ $cmd = set ] && ratio=1:0
        for c in $CONNS; do
            local t0 t1
            t0=$(date +%s.%N)
            bench "$host" --ratio=$ratio --key-pattern=R:R -c "$c" --test-time="$SECS" --pipeline=1
            t1=$(date +%s.%N)
            # Steady state only: skip the first and last second of the run for the CPU share.
            python3 - "$mode" "$cmd" "$c" "$t0" "$t1" "$HZ" "$TMP/cpu.samples" "$TMP/run.json" \
                <<'PY' >>"$TMP/results.csv"
import json, sys
mode, cmd, conns, t0, t1, hz, samples, run = sys.argv[1:]
t0, t1, hz = float(t0) + 1.0, float(t1) - 1.0, int(hz)
pts = [tuple(map(float, l.split())) for l in open(samples) if len(l.split()) == 4]
win = [p for p in pts if t0 <= p[0] <= t1]
span = win[-1][0] - win[0][0]
share = [(win[-1][i] - win[0][i]) / hz / span for i in (1, 2, 3)]
ops = json.load(open(run))["ALL STATS"]["Totals"]["Ops/sec"]
server, cpu0, cpu1 = share
print(f"{mode},{cmd},{conns},{ops:.0f},{server:.2f},{ops / server:.0f},{cpu0:.2f},{cpu1:.2f},{ops / (cpu0 + cpu1):.0f}")
PY
            tail -1 "$TMP/results.csv" >&2
        done
    done
}

echo "mode,command,connections,ops_per_sec,server_cpu_share,requests_per_server_cpu_second,cpu0_busy,cpu1_busy,requests_per_machine_cpu_second" >"$TMP/results.csv"

# Kernel mode: io_uring sockets on the veth's server end.
ip netns exec "$NS_SRV" "$LAVIK" --threads 1 --cpus 0 --bind 10.98.0.2 --port 6379 \
    --protected-mode no --data-file "$TMP/kernel.data" --data-file-size 1gb \
    >"$TMP/kernel.log" 2>&1 &
SERVER_PID=$!
start_sampler
wait_ping "$NS_SRV" 10.98.0.2 || { cat "$TMP/kernel.log"; exit 1; }
sleep 0.2
wait_ping "$NS_CLI" 10.98.0.2
measure kernel 10.98.0.2
kill "$SERVER_PID"; wait "$SERVER_PID" || true; SERVER_PID=

# DPDK mode on the same veth: the af_packet PMD takes over the server end (its kernel
# address is removed; the kernel drops what it still sees for 10.98.0.2).
ip -n "$NS_SRV" addr flush dev "$TAG-s"
ip netns exec "$NS_SRV" "$LAVIK" --threads 1 --cpus 0 --network=dpdk \
    --dpdk-eal-args "-l 0 --no-huge --no-pci --no-shconf --no-telemetry -m 512 --vdev=net_af_packet0,iface=$TAG-s" \
    --dpdk-ip 10.98.0.2/24 --protected-mode no --data-file "$TMP/afp.data" --data-file-size 1gb \
    >"$TMP/afp.log" 2>&1 &
SERVER_PID=$!
start_sampler
ip -n "$NS_CLI" neigh flush dev "$TAG-c"
wait_ping "$NS_CLI" 10.98.0.2 || { cat "$TMP/afp.log"; exit 1; }
measure dpdk-af_packet 10.98.0.2
kill "$SERVER_PID"; wait "$SERVER_PID" || true; SERVER_PID=

# DPDK mode over the tap PMD; its kernel end lives in the client namespace. The tap PMD
# signals every received frame (its RX trigger), which lavik's main thread takes.
ip netns exec "$NS_CLI" "$LAVIK" --threads 1 --cpus 0 --network=dpdk \
    --dpdk-eal-args "-l 0 --no-huge --no-pci --no-shconf --no-telemetry -m 512 --vdev=net_tap0,iface=$TAG-t" \
    --dpdk-ip 10.99.0.2/24 --protected-mode no --data-file "$TMP/tap.data" --data-file-size 1gb \
    >"$TMP/tap.log" 2>&1 &
SERVER_PID=$!
start_sampler
for _ in $(seq 200); do ip -n "$NS_CLI" link show "$TAG-t" >/dev/null 2>&1 && break; sleep 0.05; done
ip -n "$NS_CLI" addr add 10.99.0.1/24 dev "$TAG-t"
ip -n "$NS_CLI" link set "$TAG-t" up
wait_ping "$NS_CLI" 10.99.0.2 || { cat "$TMP/tap.log"; exit 1; }
measure dpdk-tap 10.99.0.2
kill "$SERVER_PID"; wait "$SERVER_PID" || true; SERVER_PID=

cat "$TMP/results.csv" >"$OUT"
