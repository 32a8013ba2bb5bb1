#!/bin/bash
# usage: mem.sh BIN N PORT KEEP  -> for "EX 86400" and "no TTL": fresh server, N keys key:0..N-1
# (value v) loaded with redis-cli --pipe, prints used_memory per key and the INFO storage sums.
# KEEP=1 keeps the EX case's data file (SIGKILLed) as /tmp/expiry-m/ttl.data for recovery runs.
BIN=$1; N=$2; PORT=$3; KEEP=$4
for CASE in ex nottl; do
  D=$(mktemp -d --tmpdir=/tmp/expiry-m)
  $BIN --port $PORT --data-file $D/lavik.data --data-file-size 2gb --no-pin-workers > /dev/null 2> $D/stderr.log &
  PID=$!
  until redis-cli -p $PORT ping 2>/dev/null | grep -q PONG; do kill -0 $PID 2>/dev/null || { cat $D/stderr.log; exit 1; }; sleep 0.2; done
  B=$(redis-cli -p $PORT info memory | grep '^used_memory:' | tr -d '\r' | cut -d: -f2)
  if [ $CASE = ex ]; then EXTRA='*5\r\n$3\r\nSET\r\n'; else EXTRA='*3\r\n$3\r\nSET\r\n'; fi
  T0=$(date +%s.%N)
  awk -v n=$N -v c=$CASE 'BEGIN{for(i=0;i<n;i++){k="key:" i; if(c=="ex") printf "*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$1\r\nv\r\n$2\r\nEX\r\n$5\r\n86400\r\n", length(k), k; else printf "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$1\r\nv\r\n", length(k), k}}' \
    | redis-cli -p $PORT --pipe | tail -1
  T1=$(date +%s.%N)
  A=$(redis-cli -p $PORT info memory | grep '^used_memory:' | tr -d '\r' | cut -d: -f2)
  ST=$(redis-cli -p $PORT info storage)
  sum() { echo "$ST" | grep '^shard' | tr ',:' '\n\n' | grep "^ *$1=" | cut -d= -f2 | paste -sd+ | bc; }
  echo "$CASE: N=$N load $(echo "$T1 - $T0" | bc) s; $(redis-cli -p $PORT info keyspace | grep db0 | tr -d '\r'); used_memory $B -> $A: $(echo "scale=2; ($A - $B) / $N" | bc) B/key; index $(echo "scale=2; $(sum index_bytes) / $N" | bc) B/key; TTL state $(echo "scale=2; $(sum expiry_bytes) / $N" | bc) B/key; volatile $(sum volatile_entries); RSS $(ps -o rss= -p $PID) KiB"
  kill -9 $PID; wait $PID 2>/dev/null
  if [ "$KEEP" = 1 ] && [ $CASE = ex ]; then mv $D/lavik.data /tmp/expiry-m/ttl.data; fi
  rm -rf $D
done
