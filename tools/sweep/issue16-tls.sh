#!/usr/bin/env bash
# Issue 16's TLS benchmark: TLS and plaintext GET/SET per server CPU-second, lavik (one worker)
# vs Debian's redis-server, redis-benchmark, 100k keys x 100 B, 16 and 64 connections,
# servers alternating (tools/sweep/rb-bench.py). Makes a throwaway CA, server and client
# certificate with openssl in /tmp/lavik-bench-tls first (the config points there).
#   cargo build --release -p lavik
#   tools/sweep/issue16-tls.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
D=/tmp/lavik-bench-tls
mkdir -p $D
if [ ! -f $D/client.crt ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=bench-ca -keyout $D/ca.key -out $D/ca.crt
    openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout $D/server.key -out $D/server.csr
    printf "subjectAltName=IP:127.0.0.1,DNS:localhost\n" >$D/ext
    openssl x509 -req -in $D/server.csr -CA $D/ca.crt -CAkey $D/ca.key -CAcreateserial -days 30 -extfile $D/ext -out $D/server.crt
    openssl req -newkey rsa:2048 -nodes -subj /CN=client -keyout $D/client.key -out $D/client.csr
    openssl x509 -req -in $D/client.csr -CA $D/ca.crt -CAkey $D/ca.key -CAcreateserial -days 30 -out $D/client.crt
fi
rm -f /tmp/lavik-bench-tls.data
python3 tools/sweep/rb-bench.py tools/sweep/issue16-tls.json
rm -f /tmp/lavik-bench-tls.data
