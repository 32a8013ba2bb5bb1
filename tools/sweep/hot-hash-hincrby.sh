#!/bin/bash
# HINCRBY of one field on a hot paged hash (~259k fields, filled with HSET -r 1000000 -P 32),
# cache off, 50 connections, twice; requests per server CPU-second as in hot-hash-set.sh.
# usage: tools/sweep/hot-hash-hincrby.sh BIN|redis PORT LABEL
BIN=$1; PORT=$2; L=$3
mkdir -p /var/tmp/hb; D=/var/tmp/hb/$L.data; rm -f $D
if [ "$BIN" = redis ]; then taskset -c 0 redis-server --bind 127.0.0.1 --port $PORT --save '' --appendonly no >/dev/null 2>&1 &
else taskset -c 0 $BIN --bind 127.0.0.1 --port $PORT --threads 1 --data-file $D --data-file-size 4gb --cache-size 0 > /dev/null 2>&1 & fi
PID=$!
for i in $(seq 50); do redis-cli -p $PORT ping 2>/dev/null | grep -q PONG && break; sleep 0.2; done
taskset -c 1 redis-benchmark -p $PORT -c 50 -P 32 -n 300000 -r 1000000 -q hset myhash element:__rand_int__ 1 > /dev/null 2>&1
echo "$L hlen=$(redis-cli -p $PORT hlen myhash)"
for rep in 1 2; do
  c0=$(awk '{print $14+$15}' /proc/$PID/stat)
  taskset -c 1 redis-benchmark -p $PORT -c 50 -n 30000 -r 1000000 -q hincrby myhash element:__rand_int__ 1 > /tmp/hi-$L.txt 2>&1
  c1=$(awk '{print $14+$15}' /proc/$PID/stat)
  echo "$L hincrby rep=$rep cpu_ticks=$((c1-c0)) ops_per_cpu_s=$((30000*100/(c1-c0+1))) $(tr '\r' '\n' < /tmp/hi-$L.txt | grep -v '^$' | tail -1)"
done
kill $PID; wait $PID 2>/dev/null; rm -f $D
