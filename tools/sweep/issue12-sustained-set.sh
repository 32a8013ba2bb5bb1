#!/bin/bash
# Issue 12: a sustained SET load on 2 workers, recorded per 10 s. 1M keys x 1 KiB (every
# value on the device, --cache-size 0), filled first, then ROUNDS back-to-back 10 s runs of
# random SETs at 200 connections, pipeline 1 (as the consecutive runs that showed the old
# collapse). Per run: SET/s, the server's CPU seconds (utime+stime from /proc), device
# bytes read and written per SET, and defrag's bytes written (so defrag is seen running).
# Usage: tools/sweep/issue12-sustained-set.sh LAVIK LAVIK_BENCH PORT DATA_FILE OUT_CSV [ROUNDS]
set -eu
LAVIK=$1 BENCH=$2 PORT=$3 DATA=$4 OUT=$5 ROUNDS=${6:-30}
TICKS=$(getconf CLK_TCK)
rm -f "$DATA"
"$LAVIK" --threads 2 --cache-size 0 --bind 127.0.0.1 --port "$PORT" --data-file "$DATA" \
  --data-file-size 4gb > "$OUT.server.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -f "$DATA"' EXIT
until redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG; do sleep 0.2; done
"$BENCH" -s 127.0.0.1 -p "$PORT" -t 1 -c 16 --requests=allkeys --ratio=1:0 --key-pattern=P:P \
  --pipeline=32 --key-minimum=1 --key-maximum=1000000 --key-prefix=memtier- -d 1024 \
  --hide-histogram > "$OUT.fill.log" 2>&1
info() { redis-cli -p "$PORT" info all | tr -d '\r' | awk -F: -v k="$1" '$1==k {print $2}'; }
cpu() { awk -v t="$TICKS" '{printf "%.3f", ($14+$15)/t}' /proc/$PID/stat; }
echo "run,start_utc,set_per_s,server_cpu_s,set_per_cpu_s,read_bytes_per_set,write_bytes_per_set,defrag_write_bytes,loadavg" > "$OUT"
for i in $(seq 1 "$ROUNDS"); do
  c0=$(cpu); r0=$(info lavik_device_read_bytes); w0=$(info lavik_device_write_bytes)
  d0=$(info lavik_defrag_write_bytes); n0=$(info total_commands_processed)
  start=$(date -u +%H:%M:%S)
  "$BENCH" -s 127.0.0.1 -p "$PORT" -t 1 -c 200 --test-time=10 --ratio=1:0 --key-pattern=R:R \
    --pipeline=1 --key-minimum=1 --key-maximum=1000000 --key-prefix=memtier- -d 1024 \
    --distinct-client-seed --hide-histogram > "$OUT.run$i.log" 2>&1
  c1=$(cpu); r1=$(info lavik_device_read_bytes); w1=$(info lavik_device_write_bytes)
  d1=$(info lavik_defrag_write_bytes); n1=$(info total_commands_processed)
  ops=$(awk '/^Sets/ {print $2}' "$OUT.run$i.log")
  sets=$((n1 - n0 - 10))
  echo "$i,$start,$ops,$(echo "$c1 - $c0" | bc),$(echo "scale=0; $sets / ($c1 - $c0)" | bc),$(echo "scale=0; ($r1 - $r0) / $sets" | bc),$(echo "scale=0; ($w1 - $w0) / $sets" | bc),$((d1 - d0)),$(cut -d' ' -f1 /proc/loadavg)" >> "$OUT"
  tail -1 "$OUT"
done
redis-cli -p "$PORT" dbsize > "$OUT.dbsize"
