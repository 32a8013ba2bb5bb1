#!/bin/bash
# One hot paged hash and set from 50 connections, cache off: fills myhash/myset with
# ~260k members (pipelined HSET/SADD -r 1000000), then measures redis-benchmark -t hset
# and -t sadd (-r 1000000) twice each, as requests per server CPU-second (utime+stime of
# the server from /proc/PID/stat). Server pinned to CPU 0, client to CPU 1.
# usage: tools/sweep/hot-hash-set.sh BIN|redis PORT LABEL [extra lavik args]
# (env FILL: fill requests per key, default 300000; N: requests per point, default 30000)
BIN=$1; PORT=$2; L=$3; shift 3
mkdir -p /var/tmp/hb; D=/var/tmp/hb/$L.data; rm -f $D
if [ "$BIN" = redis ]; then
  taskset -c 0 redis-server --bind 127.0.0.1 --port $PORT --save '' --appendonly no > /tmp/hb-$L.log 2>&1 &
else
  taskset -c 0 $BIN --bind 127.0.0.1 --port $PORT --threads 1 --data-file $D --data-file-size 4gb --cache-size 0 "$@" > /tmp/hb-$L.log 2>&1 &
fi
PID=$!
for i in $(seq 50); do redis-cli -p $PORT ping 2>/dev/null | grep -q PONG && break; sleep 0.2; done
taskset -c 1 redis-benchmark -p $PORT -c 50 -P 32 -n ${FILL:-300000} -r 1000000 -q hset myhash element:__rand_int__ xyz > /dev/null 2>&1
taskset -c 1 redis-benchmark -p $PORT -c 50 -P 32 -n ${FILL:-300000} -r 1000000 -q sadd myset element:__rand_int__ > /dev/null 2>&1
echo "$L fill hlen=$(redis-cli -p $PORT hlen myhash) scard=$(redis-cli -p $PORT scard myset)"
for rep in 1 2; do
for t in hset sadd; do
  c0=$(awk '{print $14+$15}' /proc/$PID/stat)
  taskset -c 1 redis-benchmark -p $PORT -c 50 -n ${N:-30000} -r 1000000 -t $t -q > /tmp/hb-$L-$t.txt 2>&1
  c1=$(awk '{print $14+$15}' /proc/$PID/stat)
  echo "$L $t rep=$rep cpu_ticks=$((c1-c0)) ops_per_cpu_s=$((${N:-30000}*100/(c1-c0+1))) $(tr '\r' '\n' < /tmp/hb-$L-$t.txt | grep -v '^$' | tail -1)"
done; done
kill $PID; wait $PID 2>/dev/null; rm -f $D
