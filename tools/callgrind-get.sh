#!/bin/bash
# Instructions per GET with the cache off, by callgrind (docs/benchmarks/issue11-strings,
# 2026-12-02 section). Usage: tools/callgrind-get.sh LAVIK_BINARY WORKDIR PORT [LAVIK_BENCH]
# Prints Ir per GET: the process's total Ir over the measured GETs / their number (user
# space only). FILLN keys x 1 KiB are filled; the GETs go to random keys among the first
# GETN, which lie in closed log blocks, so each GET is a device read (check device_reads).
# WORKDIR is deleted and recreated; it holds a 256 MiB data file while this runs.
set -u
BIN=$1; D=$2; PORT=$3; BENCH=${4:-target/release/lavik-bench}
FILLN=${FILLN:-40000}; GETN=${GETN:-16000}; CONNS=50; PER_CONN=400
rm -rf "$D"; mkdir -p "$D"
valgrind --tool=callgrind --callgrind-out-file="$D/cg.out.%p" "$BIN" --bind 127.0.0.1 \
  --port "$PORT" --data-file "$D/data" --data-file-size 256mb --cache-size 0 --threads 1 \
  --log-dir "$D" > "$D/vg.log" 2>&1 &
VPID=$!
for _ in $(seq 1 240); do
  [ "$(redis-cli -p "$PORT" ping 2>/dev/null)" = PONG ] && break
  sleep 1
done
common=(-s 127.0.0.1 -p "$PORT" -t 1 --key-minimum=1 --key-prefix=memtier- -d 1024 --hide-histogram)
"$BENCH" "${common[@]}" -c 8 --requests=allkeys --ratio=1:0 --key-pattern=P:P --pipeline=32 \
  --key-maximum="$FILLN" > "$D/fill.log" 2>&1
"$BENCH" "${common[@]}" -c "$CONNS" --requests=20 --ratio=0:1 --key-pattern=R:R --pipeline=1 \
  --key-maximum="$GETN" > "$D/warm.log" 2>&1
callgrind_control -z "$VPID" > /dev/null
"$BENCH" "${common[@]}" -c "$CONNS" --requests="$PER_CONN" --ratio=0:1 --key-pattern=R:R \
  --pipeline=1 --key-maximum="$GETN" > "$D/run.log" 2>&1
callgrind_control -d "$VPID" > /dev/null
sleep 2
redis-cli -p "$PORT" info stats | grep -E "keyspace_(hits|misses)"
redis-cli -p "$PORT" info all | grep -o "device_reads=[0-9]*" | awk -F= '{s+=$2} END {print "device_reads (all shards):", s}'
kill "$VPID"; wait "$VPID"
total=$(callgrind_annotate "$D"/cg.out.*.1 | grep -m1 "PROGRAM TOTALS" | awk '{gsub(",", "", $1); print $1}')
echo "Ir per GET: $((total / (CONNS * PER_CONN)))"
