#!/usr/bin/env bash
# Issue 16: `lavik plan` against a real load. For N keys x 1 KiB, once without TTLs and once
# with a TTL on every key: start lavik (one worker pinned to CPU 0, default --cache-size,
# default growing data file), load every key memtier-1..N once with pipelined SETs from
# lavik-bench (16 connections, pipeline 32, CPU 1), read INFO / RSS, run random GETs so the
# record cache fills to its budget, read them again, stop, `du` the data file, count the
# blocks in use with `lavik --check-data-file`, delete the file; then print `lavik plan`'s
# figures for the same shape next to the measurements.
#   cargo build --release -p lavik -p lavik-bench
#   tools/sweep/plan-vs-measure.sh [N] [outdir]
# Needs ~1.2 x N KiB free on the file system of /var/tmp per run (one run at a time).
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-10000000}
OUT=${2:-docs/benchmarks/plan-vs-measure}
PORT=7461
LAVIK=target/release/lavik
BENCH=target/release/lavik-bench
GET_SECONDS=${GET_SECONDS:-20}
mkdir -p "$OUT"
RAW=$OUT/raw.txt
: >"$RAW"

info() { redis-cli -p $PORT info "$1" | tr -d '\r' | grep "^$2:" | cut -d: -f2; }

snapshot() { # label
    local pid=$1 label=$2
    {
        echo "[$label]"
        echo "dbsize=$(redis-cli -p $PORT dbsize)"
        for f in used_memory lavik_index_bytes lavik_cache_bytes lavik_cache_size; do
            echo "$f=$(info memory $f)"
        done
        echo "lavik_data_file_bytes=$(info storage lavik_data_file_bytes)"
        echo "rss_bytes=$(($(grep VmRSS /proc/$pid/status | awk '{print $2}') * 1024))"
        echo "loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
    } >>"$RAW"
}

run() { # name ttl(0|1)
    local name=$1 ttl=$2
    local dir
    dir=$(mktemp -d /var/tmp/lavik-plan.XXXX)
    local data=$dir/lavik.data
    taskset -c 0 "$LAVIK" --bind 127.0.0.1 --port $PORT --data-file "$data" --threads 1 \
        >"$dir/lavik.log" 2>&1 &
    local pid=$!
    until [ "$(redis-cli -p $PORT ping 2>/dev/null)" = PONG ]; do
        kill -0 $pid 2>/dev/null || { cat "$dir/lavik.log"; exit 1; }
        sleep 0.05
    done
    local cmd=(--ratio=1:0 --key-pattern=P:P)
    if [ "$ttl" = 1 ]; then
        # Every key gets a TTL far beyond the run (11.6 days): nothing expires meanwhile.
        cmd=(--command="SET __key__ __data__ EX 1000000" --command-key-pattern=P)
    fi
    local t0 t1
    t0=$(date +%s.%N)
    taskset -c 1 "$BENCH" -s 127.0.0.1 -p $PORT -t 1 -c 16 --requests=allkeys "${cmd[@]}" \
        --pipeline=32 --key-minimum=1 --key-maximum="$N" --key-prefix=memtier- -d 1024 \
        --hide-histogram --hide-progress >"$dir/fill.txt" 2>&1
    t1=$(date +%s.%N)
    {
        echo "== $name: N=$N ttl=$ttl"
        echo "load_seconds=$(echo "$t1 - $t0" | bc)"
        grep -E "Totals|errors|unanswered" "$dir/fill.txt" || true
        echo "strlen_sample=$(redis-cli -p $PORT strlen memtier-$((N / 2)))"
        echo "ttl_sample=$(redis-cli -p $PORT ttl memtier-$((N / 3)))"
    } >>"$RAW"
    snapshot $pid "$name after load"
    taskset -c 1 "$BENCH" -s 127.0.0.1 -p $PORT -t 1 -c 50 --test-time="$GET_SECONDS" \
        --ratio=0:1 --key-pattern=R:R --key-minimum=1 --key-maximum="$N" \
        --key-prefix=memtier- -d 1024 --hide-histogram --hide-progress >"$dir/get.txt" 2>&1
    grep -E "Gets|Totals" "$dir/get.txt" >>"$RAW" || true
    snapshot $pid "$name after ${GET_SECONDS}s of random GETs"
    kill -TERM $pid
    wait $pid || true
    {
        echo "du_bytes=$(du -B1 "$data" | cut -f1)"
        echo "apparent_bytes=$(stat -c %s "$data")"
        "$LAVIK" --check-data-file "$data" 2>&1 | grep -E "^(blocks|records|index|result)"
        grep -iE "grow|error|warn" "$dir/lavik.log" | tail -5 || true
        echo
    } >>"$RAW"
    rm -rf "$dir"
}

PLAN0=$("$LAVIK" plan --keys "$N" --value-bytes 1024 --threads 1)
PLAN1=$("$LAVIK" plan --keys "$N" --value-bytes 1024 --threads 1 --ttl-share 1)
{
    echo "commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%M:%SZ), df: $(df -h /var/tmp | tail -1)"
    echo "## lavik plan --keys $N --value-bytes 1024 --threads 1"
    echo "$PLAN0"
    echo "## lavik plan --keys $N --value-bytes 1024 --threads 1 --ttl-share 1"
    echo "$PLAN1"
    echo
} >>"$RAW"
run no-ttl 0
run ttl-all 1
cat "$RAW"
