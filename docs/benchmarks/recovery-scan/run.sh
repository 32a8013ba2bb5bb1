#!/bin/bash
# usage: run.sh BIN DATAFILE PORT  -> starts BIN on a copy of DATAFILE, waits for ready, prints the recovery line, stops it
BIN=$1; SRC=$2; PORT=$3
mkdir -p /tmp/recov-bench; D=$(mktemp -d --tmpdir=/tmp/recov-bench)
cp --sparse=always "$SRC" $D/lavik.data
sync; cd $D
$BIN --port $PORT --data-file $D/lavik.data --cache-size 0 > /dev/null 2> $D/stderr.log &
PID=$!
for i in $(seq 1 600); do
  if grep -q "recovery scan done\|store open" $D/stderr.log && redis-cli -p $PORT ping 2>/dev/null | grep -q PONG; then break; fi
  sleep 0.5
done
grep -E "recovery scan done|store open" $D/stderr.log
redis-cli -p $PORT info stats | grep -E "lavik_sync_reads"; redis-cli -p $PORT dbsize
echo cpu_seconds=$(ps -o times= -p $PID); kill -9 $PID; wait $PID 2>/dev/null
rm -rf $D
