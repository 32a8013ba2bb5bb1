#!/bin/sh
# time to HSET 200k fields (1000 per command) into one hash: $1 binary, $2 port, $3 tag
BIN=$1; PORT=$2; TAG=$3
rm -f /tmp/hot/fill-$TAG.data
$BIN --bind 127.0.0.1 --port $PORT --threads 1 --data-file /tmp/hot/fill-$TAG.data --data-file-size 1gb --cache-size 0 > /tmp/hot/fill-$TAG.log 2>&1 &
PID=$!
sleep 2
S=$(date +%s.%N)
python3 - <<'PY' | redis-cli -p $PORT --pipe > /dev/null
import sys
v = "v" * 100
for start in range(0, 200000, 1000):
    args = ["HSET", "big"] + [x for i in range(start, start + 1000) for x in (f"field:{i}", v)]
    sys.stdout.write("*%d\r\n" % len(args) + "".join("$%d\r\n%s\r\n" % (len(a), a) for a in args))
PY
E=$(date +%s.%N)
echo "$TAG: $(echo "$E - $S" | bc) s, HLEN $(redis-cli -p $PORT hlen big), cpu $(awk '{print ($14+$15)/100}' /proc/$PID/stat) s, $(redis-cli -p $PORT info stats | grep -E 'lavik_restart_reads|lavik_restart_fallbacks|lavik_sync_reads' | tr -d '\r' | tr '\n' ' ')"
kill $PID; wait $PID 2>/dev/null
rm -f /tmp/hot/fill-$TAG.data
