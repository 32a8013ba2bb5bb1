#!/bin/sh
# Device reads per overwriting SET (INFO storage counters) and SET/s over consecutive runs:
# lavik (release, --cache-size 0) with THREADS workers, 1M keys x 1 KiB filled, then RUNS
# runs of SECONDS s random SETs at 200 connections (server on CPU 0, client on CPU 1).
#   sh docs/benchmarks/issue12-blind-set/reads-per-set.sh THREADS PORT [RUNS] [SECONDS]
set -eu
THREADS=$1; PORT=$2; RUNS=${3:-3}; SECONDS_=${4:-15}
DATA=/tmp/lavik-settle-rps-$PORT.data
rm -f "$DATA"
taskset -c 0 target/release/lavik --threads "$THREADS" --cache-size 0 --bind 127.0.0.1 \
  --port "$PORT" --data-file "$DATA" --data-file-size 3gb >/tmp/lavik-settle-rps-$PORT.log 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; rm -f "$DATA"' EXIT
until redis-cli -p "$PORT" DBSIZE 2>/dev/null | grep -q '^[0-9]'; do sleep 0.5; done
B=target/release/lavik-bench
taskset -c 1 $B -s 127.0.0.1 -p "$PORT" -t 1 -c 16 --requests=allkeys --ratio=1:0 \
  --key-pattern=P:P --pipeline=32 --key-minimum=1 --key-maximum=1000000 -d 1024 \
  --hide-histogram >/dev/null 2>&1 || true
field() { redis-cli -p "$PORT" INFO "$1" | tr -d '\r' | sed -n "s/^$2://p"; }
cpu() { awk '{print $14+$15}' /proc/$PID/stat; }
# Summed over the per-shard lines of INFO storage (`shardN:... name=value ...`).
shards() { redis-cli -p "$PORT" INFO storage | tr -d '\r' | grep -o "[ ,{]$1[=:] *[0-9]*" | grep -o '[0-9]*$' | awk '{s+=$1} END {print s+0}'; }
moved() { shards defrag_relocated_records; }
TCK=$(getconf CLK_TCK)
echo "threads=$THREADS keys=$(redis-cli -p $PORT DBSIZE)"
echo "run set_per_s set_per_cpu_s device_reads_per_set device_read_bytes_per_set overwrite_reads_per_set sync_reads_per_set sweep_reads blind_pending defrag_relocated"
for r in $(seq 1 "$RUNS"); do
  c0=$(field stats total_commands_processed); d0=$(shards device_reads)
  b0=$(shards device_read_bytes); o0=$(field storage lavik_overwrite_reads)
  s0=$(field stats lavik_sync_reads); w0=$(field storage lavik_blind_sweep_reads)
  t0=$(cpu); m0=$(moved)
  taskset -c 1 $B -s 127.0.0.1 -p "$PORT" -t 1 -c 200 --test-time="$SECONDS_" --ratio=1:0 \
    --key-pattern=R:R --pipeline=1 --key-minimum=1 --key-maximum=1000000 -d 1024 \
    --hide-histogram >/dev/null 2>&1 || true
  c1=$(field stats total_commands_processed); d1=$(shards device_reads)
  b1=$(shards device_read_bytes); o1=$(field storage lavik_overwrite_reads)
  s1=$(field stats lavik_sync_reads); w1=$(field storage lavik_blind_sweep_reads)
  t1=$(cpu); m1=$(moved)
  n=$((c1 - c0 - 13))
  echo "$r $((n / SECONDS_)) $(echo "$n / (($t1 - $t0) / $TCK)" | bc) $(echo "scale=4; ($d1 - $d0) / $n" | bc) $(echo "($b1 - $b0) / $n" | bc) $(echo "scale=4; ($o1 - $o0) / $n" | bc) $(echo "scale=4; ($s1 - $s0) / $n" | bc) $((w1 - w0)) $(field storage lavik_blind_pending) $((m1 - m0))"
done
