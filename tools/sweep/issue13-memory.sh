#!/usr/bin/env bash
# Issue 13 (a), RAM: lavik (one worker, --cache-size 0) and redis-server filled in three
# steps, 1M keys each: strings of 100 B (memtier-N), hashes of 10 fields x 100 B (hash-N),
# sets of 10 members m1..m10 (set-N); INFO used_memory and RSS after each step, so the
# per-key cost of each type is the step's delta / 1M. Same fills as
# tools/sweep/issue13-hash-set.conf (lavik-bench, P:P, every key once, 16 conns, pipeline 32).
#   cargo build --release -p lavik -p lavik-bench
#   tools/sweep/issue13-memory.sh [N] > docs/benchmarks/issue13-hash-set/memory.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-1000000}
BENCH=target/release/lavik-bench
DATA=/tmp/lavik-bench-issue13-mem.data
F="f1 __data__ f2 __data__ f3 __data__ f4 __data__ f5 __data__ f6 __data__ f7 __data__ f8 __data__ f9 __data__ f10 __data__"
info() { redis-cli -p "$1" info memory | tr -d '\r' | grep "^$2:" | cut -d: -f2; }
rss() { echo $(($(grep VmRSS /proc/$1/status | awk '{print $2}') * 1024)); }
fill() { # port prefix command...
    local port=$1 prefix=$2
    shift 2
    taskset -c 1 "$BENCH" -s 127.0.0.1 -p "$port" -t 1 -c 16 --requests=allkeys \
        --command="$*" --command-key-pattern=P --pipeline=32 --key-minimum=1 --key-maximum="$N" \
        --key-prefix="$prefix" -d 100 --hide-histogram --hide-progress | grep -E "^Totals|errors|unanswered" || true
}
measure() { # name port pid
    local name=$1 port=$2 pid=$3 prev_used prev_rss used r
    echo "## $name"
    prev_used=$(info "$port" used_memory)
    prev_rss=$(rss "$pid")
    echo "| step | DBSIZE | used_memory | RSS | used_memory per key of the step | RSS per key of the step |"
    echo "|---|---:|---:|---:|---:|---:|"
    echo "| empty | $(redis-cli -p "$port" dbsize) | $prev_used | $prev_rss | | |"
    for step in "strings 100 B|memtier-|SET __key__ __data__" \
        "hashes 10 x 100 B|hash-|HSET __key__ $F" \
        "sets 10 members|set-|SADD __key__ m1 m2 m3 m4 m5 m6 m7 m8 m9 m10"; do
        IFS='|' read -r label prefix cmd <<<"$step"
        fill "$port" "$prefix" $cmd >&2
        sleep 1
        used=$(info "$port" used_memory)
        r=$(rss "$pid")
        echo "| + $N $label | $(redis-cli -p "$port" dbsize) | $used | $r | $(echo "scale=1; ($used - $prev_used) / $N" | bc) | $(echo "scale=1; ($r - $prev_rss) / $N" | bc) |"
        prev_used=$used
        prev_rss=$r
    done
    echo
    echo "samples: HLEN hash-$((N / 2)) = $(redis-cli -p "$port" hlen hash-$((N / 2))), SCARD set-$((N / 3)) = $(redis-cli -p "$port" scard set-$((N / 3))), STRLEN memtier-7 = $(redis-cli -p "$port" strlen memtier-7), object encoding hash/set: $(redis-cli -p "$port" object encoding hash-1 2>&1) / $(redis-cli -p "$port" object encoding set-1 2>&1)"
    echo
}
echo "commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%M:%SZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
rm -f $DATA
taskset -c 0 target/release/lavik --bind 127.0.0.1 --port 7495 --threads 1 --cache-size 0 \
    --data-file $DATA --data-file-size 6gb >/tmp/lavik-bench-issue13-mem.log 2>&1 &
LP=$!
until [ "$(redis-cli -p 7495 ping 2>/dev/null)" = PONG ]; do sleep 0.1; done
measure "lavik (1 worker, --cache-size 0)" 7495 $LP
echo "lavik_index_bytes at the end: $(info 7495 lavik_index_bytes)"
echo
kill -TERM $LP; wait $LP || true
rm -f $DATA
taskset -c 0 redis-server --port 7496 --bind 127.0.0.1 --save "" --appendonly no >/tmp/redis-issue13-mem.log 2>&1 &
RP=$!
until [ "$(redis-cli -p 7496 ping 2>/dev/null)" = PONG ]; do sleep 0.1; done
measure "redis-server $(redis-server --version | awk '{print $3}')" 7496 $RP
kill -TERM $RP; wait $RP || true
