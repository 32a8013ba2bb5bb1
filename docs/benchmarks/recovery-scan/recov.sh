#!/bin/bash
# usage: recov.sh BIN DATAFILE PORT -> starts BIN on DATAFILE (no copy), waits for ready, prints the recovery line, SIGKILLs it
BIN=$1; F=$2; PORT=$3
sync
$BIN --port $PORT --data-file $F --cache-size 0 --no-pin-workers > /dev/null 2> /tmp/expiry-m/recov-stderr.log &
PID=$!
for i in $(seq 1 1200); do
  if grep -q "recovery scan done\|store open" /tmp/expiry-m/recov-stderr.log && redis-cli -p $PORT ping 2>/dev/null | grep -q PONG; then break; fi
  sleep 0.25
done
grep -E "recovery scan done|store open" /tmp/expiry-m/recov-stderr.log | sed 's/^.*INFO //'
redis-cli -p $PORT dbsize
echo cpu_seconds=$(ps -o times= -p $PID); kill -9 $PID; wait $PID 2>/dev/null
