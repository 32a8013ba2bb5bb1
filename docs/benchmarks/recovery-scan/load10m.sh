#!/bin/bash
# usage: load10m.sh BIN N PORT OUT -> fresh server on OUT (2 GB data file), N keys key:0..N-1
# set to "v" with EX 86400 through redis-cli --pipe, DBSIZE, then SIGKILL (no checkpoint:
# the next start on OUT scans the whole file).
BIN=$1; N=$2; PORT=$3; OUT=$4
rm -f $OUT
$BIN --port $PORT --data-file $OUT --data-file-size 2gb --no-pin-workers > /dev/null 2> $OUT.load.log &
PID=$!
until redis-cli -p $PORT ping 2>/dev/null | grep -q PONG; do kill -0 $PID 2>/dev/null || { cat $OUT.load.log; exit 1; }; sleep 0.2; done
T0=$(date +%s.%N)
awk -v n=$N 'BEGIN{for(i=0;i<n;i++){k="key:" i; printf "*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$1\r\nv\r\n$2\r\nEX\r\n$5\r\n86400\r\n", length(k), k}}' \
  | redis-cli -p $PORT --pipe | tail -1
T1=$(date +%s.%N)
echo "load $(echo "$T1 - $T0" | bc) s; dbsize $(redis-cli -p $PORT dbsize)"
kill -9 $PID; wait $PID 2>/dev/null
