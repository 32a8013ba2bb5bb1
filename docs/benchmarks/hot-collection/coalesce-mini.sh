#!/bin/sh
# usage: mini.sh MODE(yes|no) PORT
BIN=/work/wt/coalesce/target/debug/lavik
rm -f /tmp/coalesce/m-$1.data
$BIN --bind 127.0.0.1 --port $2 --threads 1 --data-file /tmp/coalesce/m-$1.data --data-file-size 1gb --cache-size 0 --coalesce-lists $1 > /tmp/coalesce/m-$1.log 2>&1 &
PID=$!
sleep 3
for t in lpush lpop rpush rpop; do
  c0=$(awk '{print $14+$15}' /proc/$PID/stat)
  redis-benchmark -p $2 -c 50 -n 20000 -d 3 -t $t -q > /tmp/coalesce/m-$1-$t.txt 2>&1
  c1=$(awk '{print $14+$15}' /proc/$PID/stat)
  echo "$1 $t cpu_ticks=$((c1-c0)) ops_per_cpu_s=$((20000*100/(c1-c0+1))) $(tr '\r' '\n' < /tmp/coalesce/m-$1-$t.txt | tail -1)"
done
redis-cli -p $2 info storage | grep coalesced
kill $PID; wait $PID 2>/dev/null; rm -f /tmp/coalesce/m-$1.data
