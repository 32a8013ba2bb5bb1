#!/usr/bin/env bash
# Issue 12's scale run: N keys of V-byte values loaded through the server, compared with
# the same binary holding 1M keys of the same size. Reports DBSIZE, used_memory and index
# bytes per key, RSS, bytes on disk, the fill rate, GET and SET requests per server
# CPU-second at N keys and at 1M keys (alternating points, random keys, every GET a device
# read: --cache-size 0), restart time after SIGKILL (full scan) and after a clean shutdown
# with the checkpoint. Needs a release build:
#   cargo build --release -p lavik -p lavik-bench
#   tools/sweep/issue12-scale.sh N VALUE_BYTES DATA_FILE_GB OUT_DIR [WORKDIR]
# Server pinned to CPU 0, client to CPU 1; one worker (--threads 1) so the per-request
# cost is not mixed with cross-worker hops.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=$1
V=$2
GB=$3
OUT=$4
W=${5:-/var/tmp/lavik-scale}
POINT_S=${POINT_S:-10}
REPEATS=${REPEATS:-3}
CONNS=${CONNS:-50}
BIG_PORT=${BIG_PORT:-7701}
SMALL_PORT=${SMALL_PORT:-7702}
SMALL_N=1000000
LAVIK=${LAVIK:-target/release/lavik}
BENCH=${BENCH:-target/release/lavik-bench}
mkdir -p "$OUT" "$W"
LOG=$OUT/run.log
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }

declare -A PIDS
start() { # name port datafile size_gb
    local name=$1 port=$2 data=$3 size=$4
    local t0
    t0=$(date +%s.%N)
    taskset -c 0 "$LAVIK" --threads 1 --cache-size 0 --bind 127.0.0.1 --port "$port" \
        --data-file "$data" --data-file-size "${size}gb" --shutdown-checkpoint \
        --log-dir "$W" >>"$W/$name.log" 2>&1 &
    PIDS[$name]=$!
    until [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ]; do
        kill -0 "${PIDS[$name]}" 2>/dev/null || { tail -20 "$W/$name.log"; exit 1; }
        sleep 0.05
    done
    STARTUP=$(echo "$(date +%s.%N) - $t0" | bc)
}
info() { redis-cli -p "$1" info "$2" | tr -d '\r' | grep "^$3:" | cut -d: -f2; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
bench() { # port keys args...
    local port=$1 keys=$2
    shift 2
    taskset -c 1 "$BENCH" -s 127.0.0.1 -p "$port" -t 1 --key-minimum=1 --key-maximum="$keys" \
        --key-prefix=memtier- -d "$V" --hide-histogram "$@"
}
fill() { # name port keys
    local t0 t1
    t0=$(date +%s.%N)
    bench "$2" "$3" -c 16 --requests=allkeys --ratio=1:0 --key-pattern=P:P --pipeline=32 \
        >"$W/fill-$1.txt" 2>&1
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}
point() { # name port keys ratio -> prints "ops_per_s ops_per_cpu_s"
    local name=$1 port=$2 keys=$3 ratio=$4 pid=${PIDS[$1]} c0 c1 out ops
    c0=$(cpu_ticks "$pid")
    out=$(bench "$port" "$keys" -c "$CONNS" --test-time="$POINT_S" --ratio="$ratio" \
        --key-pattern=R:R --pipeline=1 2>&1)
    c1=$(cpu_ticks "$pid")
    ops=$(echo "$out" | awk '/^Totals/ {print $2; exit}')
    local tck
    tck=$(getconf CLK_TCK)
    echo "$ops $(echo "scale=0; $ops * $POINT_S * $tck / ($c1 - $c0)" | bc)"
}

say "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD), N=$N, V=$V, load $(cut -d' ' -f1-3 /proc/loadavg)"
rm -f "$W/big.data" "$W/small.data"
start big "$BIG_PORT" "$W/big.data" "$GB"
FILL_S=$(fill big "$BIG_PORT" "$N")
DBSIZE=$(redis-cli -p "$BIG_PORT" dbsize)
USED=$(info "$BIG_PORT" memory used_memory)
INDEX=$(info "$BIG_PORT" memory lavik_index_bytes)
RSS_KB=$(grep VmRSS "/proc/${PIDS[big]}/status" | awk '{print $2}')
DISK=$(du -B1 "$W/big.data" | cut -f1)
say "fill: $FILL_S s, DBSIZE $DBSIZE, used_memory $USED, index $INDEX, RSS ${RSS_KB} kB, file $DISK B, load $(cut -d' ' -f1-3 /proc/loadavg)"
redis-cli -p "$BIG_PORT" info all | tr -d '\r' | grep -E '^(used_memory|lavik_index|lavik_device|lavik_log|lavik_live|lavik_blocks|lavik_defrag)' >>"$LOG" || true

start small "$SMALL_PORT" "$W/small.data" 2
SMALL_FILL_S=$(fill small "$SMALL_PORT" "$SMALL_N")
say "small fill: $SMALL_FILL_S s, DBSIZE $(redis-cli -p "$SMALL_PORT" dbsize), used_memory $(info "$SMALL_PORT" memory used_memory)"

say "points (ops/s, ops per server CPU-second), $CONNS connections, pipeline 1, ${POINT_S}s each:"
for r in $(seq 1 "$REPEATS"); do
    for cmd in get set; do
        ratio=0:1
        [ "$cmd" = set ] && ratio=1:0
        b=$(point big "$BIG_PORT" "$N" "$ratio")
        s=$(point small "$SMALL_PORT" "$SMALL_N" "$ratio")
        say "repeat $r $cmd big $b small $s load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
done
say "device reads big: $(redis-cli -p "$BIG_PORT" info all | tr -d '\r' | grep -o 'device_reads=[0-9]*' | awk -F= '{s+=$2} END {print s}')"
kill -TERM "${PIDS[small]}"
wait "${PIDS[small]}" || true

DB_BEFORE=$(redis-cli -p "$BIG_PORT" dbsize)
kill -KILL "${PIDS[big]}"
wait "${PIDS[big]}" 2>/dev/null || true
start big "$BIG_PORT" "$W/big.data" "$GB"
say "restart after SIGKILL (full scan): $STARTUP s to PONG, DBSIZE $(redis-cli -p "$BIG_PORT" dbsize) (before: $DB_BEFORE)"
redis-cli -p "$BIG_PORT" info all | tr -d '\r' | grep -iE 'recover|loading' >>"$LOG" || true
kill -TERM "${PIDS[big]}"
wait "${PIDS[big]}" || true
start big "$BIG_PORT" "$W/big.data" "$GB"
say "restart after a clean shutdown (checkpoint): $STARTUP s to PONG, DBSIZE $(redis-cli -p "$BIG_PORT" dbsize)"
kill -TERM "${PIDS[big]}"
wait "${PIDS[big]}" || true
say "# done $(date -u +%FT%TZ)"
rm -f "$W/big.data" "$W/small.data"
