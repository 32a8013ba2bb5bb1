#!/bin/bash
# usage: recov2.sh BIN DATAFILE PORT [PERFDATA] -> starts BIN on DATAFILE (no copy), waits for
# the first PONG, prints the recovery lines, DBSIZE and the process CPU time, SIGKILLs it (so
# the next start scans again). With PERFDATA, runs it under `perf record -g` into that file.
BIN=$1; F=$2; PORT=$3; PERFDATA=$4
LOG=$(dirname $F)/recov-stderr.$PORT.log
sync
if [ -n "$PERFDATA" ]; then
  perf record -F 999 -g -o $PERFDATA -- $BIN --port $PORT --data-file $F --cache-size 0 --no-pin-workers > /dev/null 2> $LOG &
  PERF_PID=$!; sleep 1; PID=$(pgrep -P $PERF_PID | head -1)
else
  $BIN --port $PORT --data-file $F --cache-size 0 --no-pin-workers > /dev/null 2> $LOG &
  PID=$!
fi
T0=$(date +%s.%N)
until redis-cli -p $PORT ping 2>/dev/null | grep -q PONG; do sleep 0.05; done
T1=$(date +%s.%N)
grep -E "recovery scan done|store open|recovery phases" $LOG | sed 's/^.*INFO //'
echo "first_pong_s=$(echo "$T1 - $T0" | bc) dbsize=$(redis-cli -p $PORT dbsize) cpu=$(ps -o times= -p $PID) load=\"$(cut -d' ' -f1-3 /proc/loadavg)\""
kill -9 $PID; wait 2>/dev/null
