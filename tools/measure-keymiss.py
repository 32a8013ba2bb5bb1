#!/usr/bin/env python3
"""Measures Redis's keyspace_hits/keyspace_misses deltas and keymiss events per keyed
command, with its keys missing and present (right types). Usage: tools/measure-keymiss.py PORT"""
import socket, sys, time

def enc(args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out

class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.buf = b""
    def line(self):
        while b"\r\n" not in self.buf:
            d = self.s.recv(65536)
            if not d: raise EOFError
            self.buf += d
        l, self.buf = self.buf.split(b"\r\n", 1)
        return l
    def exact(self, n):
        while len(self.buf) < n + 2:
            self.buf += self.s.recv(65536)
        d, self.buf = self.buf[:n], self.buf[n + 2:]
        return d
    def read(self):
        l = self.line(); t = l[:1]; r = l[1:]
        if t in (b"+", b"-", b":"): return l
        if t == b"$":
            n = int(r); return None if n < 0 else self.exact(n)
        if t == b"*":
            n = int(r); return None if n < 0 else [self.read() for _ in range(n)]
        raise ValueError(l)
    def cmd(self, *args):
        self.s.sendall(enc(args)); return self.read()

port = int(sys.argv[1])
c = Conn(port); sub = Conn(port)
c.cmd("config", "set", "notify-keyspace-events", "KEAm")
sub.cmd("psubscribe", "__key*__:*")
sub.s.settimeout(0.05)

def stats():
    info = c.cmd("info", "stats").decode()
    d = dict(l.split(":", 1) for l in info.split("\r\n") if ":" in l)
    return int(d["keyspace_hits"]), int(d["keyspace_misses"])

def events():
    got = []
    c.cmd("publish", "__keyevent@0__:zzfence", "x")  # fence: drained when seen
    sub.s.settimeout(2)
    while True:
        m = sub.read()
        if m[2] == b"__keyevent@0__:zzfence": break
        if b"keymiss" in m[2] or m[3] == b"keymiss":
            got.append(m[2].decode().split(":", 1)[1] if m[3] == b"keymiss" else "E:" + m[3].decode())
    return got

# Setups: how to create a key of each type.
MK = {
    "s": lambda k: c.cmd("set", k, "10"),
    "h": lambda k: c.cmd("hset", k, "f", "1"),
    "S": lambda k: c.cmd("sadd", k, "m", "n"),
    "l": lambda k: c.cmd("rpush", k, "a", "b"),
    "z": lambda k: c.cmd("zadd", k, "1", "m"),
    "g": lambda k: c.cmd("geoadd", k, "13.36", "38.11", "m"),
    "p": lambda k: c.cmd("pfadd", k, "a"),
}
# (command args, {key: type}); keys a b c d; '!' marks a key never created (the destination).
CASES = [
 ("get a", "a:s"), ("set a v", "a:s"), ("set a v nx", "a:s"), ("set a v xx", "a:s"), ("set a v get", "a:s"),
 ("setnx a v", "a:s"), ("setex a 100 v", "a:s"), ("psetex a 100000 v", "a:s"), ("getset a v", "a:s"),
 ("getdel a", "a:s"), ("getex a", "a:s"), ("getex a ex 100", "a:s"), ("mget a b a", "a:s b:s"),
 ("mset a 1 b 2", "a:s b:s"), ("msetnx a 1 b 2", "a:s b:s"), ("append a x", "a:s"), ("strlen a", "a:s"),
 ("getrange a 0 1", "a:s"), ("substr a 0 1", "a:s"), ("setrange a 1 x", "a:s"), ("incr a", "a:s"),
 ("decr a", "a:s"), ("incrby a 2", "a:s"), ("decrby a 2", "a:s"), ("incrbyfloat a 1.5", "a:s"),
 ("lcs a b", "a:s b:s"), ("setbit a 1 1", "a:s"), ("getbit a 1", "a:s"), ("bitcount a", "a:s"),
 ("bitpos a 1", "a:s"), ("bitop and d a b", "a:s b:s"), ("bitop not d a", "a:s"),
 ("bitfield a get u8 0", "a:s"), ("bitfield a set u8 0 1", "a:s"), ("bitfield_ro a get u8 0", "a:s"),
 ("pfadd a x", "a:p"), ("pfcount a", "a:p"), ("pfcount a b", "a:p b:p"), ("pfmerge d a b", "a:p b:p"),
 ("pfmerge a b", "a:p b:p"),
 ("hset a f v", "a:h"), ("hsetnx a f v", "a:h"), ("hmset a f v", "a:h"), ("hget a f", "a:h"),
 ("hmget a f g", "a:h"), ("hdel a f", "a:h"), ("hlen a", "a:h"), ("hstrlen a f", "a:h"),
 ("hexists a f", "a:h"), ("hkeys a", "a:h"), ("hvals a", "a:h"), ("hgetall a", "a:h"),
 ("hincrby a f 1", "a:h"), ("hincrbyfloat a f 1", "a:h"), ("hrandfield a", "a:h"), ("hrandfield a 2", "a:h"),
 ("hscan a 0", "a:h"),
 ("sadd a m", "a:S"), ("srem a m", "a:S"), ("scard a", "a:S"), ("sismember a m", "a:S"),
 ("smismember a m x", "a:S"), ("smembers a", "a:S"), ("srandmember a", "a:S"), ("srandmember a 2", "a:S"),
 ("spop a", "a:S"), ("spop a 1", "a:S"), ("smove a b m", "a:S b:S"), ("sinter a b", "a:S b:S"),
 ("sintercard 2 a b", "a:S b:S"), ("sinterstore d a b", "a:S b:S"), ("sunion a b", "a:S b:S"),
 ("sunionstore d a b", "a:S b:S"), ("sdiff a b", "a:S b:S"), ("sdiffstore d a b", "a:S b:S"),
 ("sscan a 0", "a:S"),
 ("lpush a x", "a:l"), ("rpush a x", "a:l"), ("lpushx a x", "a:l"), ("rpushx a x", "a:l"),
 ("lpop a", "a:l"), ("rpop a", "a:l"), ("lpop a 1", "a:l"), ("llen a", "a:l"), ("lindex a 0", "a:l"),
 ("lset a 0 x", "a:l"), ("lrange a 0 -1", "a:l"), ("linsert a before a x", "a:l"), ("lrem a 0 a", "a:l"),
 ("ltrim a 0 0", "a:l"), ("lpos a b", "a:l"), ("lmove a b left right", "a:l b:l"),
 ("rpoplpush a b", "a:l b:l"), ("lmpop 2 a b left", "a:l b:l"),
 ("blpop a b 0.01", "a:l b:l"), ("brpop a 0.01", "a:l"), ("blmove a b left right 0.01", "a:l b:l"),
 ("brpoplpush a b 0.01", "a:l b:l"), ("blmpop 0.01 2 a b left", "a:l b:l"),
 ("bzpopmin a 0.01", "a:z"), ("bzpopmax a 0.01", "a:z"), ("bzmpop 0.01 2 a b min", "a:z b:z"),
 ("del a b", "a:s b:s"), ("unlink a b", "a:s b:s"), ("exists a b a", "a:s b:s"), ("touch a b a", "a:s b:s"),
 ("type a", "a:s"), ("sort a", "a:l"), ("sort a store d", "a:l"), ("sort_ro a", "a:l"),
 ("sort a by nosort", "a:l"), ("sort a by w_* get o_*", "a:l"),
 ("rename a b", "a:s b:s"), ("renamenx a b", "a:s b:s"), ("move a 1", "a:s"), ("copy a b", "a:s b:s"),
 ("copy a b replace", "a:s b:s"), ("dump a", "a:s"), ("object encoding a", "a:s"), ("object freq a", "a:s"),
 ("object idletime a", "a:s"), ("object refcount a", "a:s"),
 ("expire a 100", "a:s"), ("pexpire a 100000", "a:s"), ("expireat a 9999999999", "a:s"),
 ("pexpireat a 9999999999999", "a:s"), ("ttl a", "a:s"), ("pttl a", "a:s"), ("expiretime a", "a:s"),
 ("pexpiretime a", "a:s"), ("persist a", "a:s"),
 ("zadd a 1 m", "a:z"), ("zincrby a 1 m", "a:z"), ("zrem a m", "a:z"), ("zcard a", "a:z"),
 ("zscore a m", "a:z"), ("zmscore a m x", "a:z"), ("zrank a m", "a:z"), ("zrevrank a m", "a:z"),
 ("zcount a -inf +inf", "a:z"), ("zlexcount a - +", "a:z"), ("zrange a 0 -1", "a:z"),
 ("zrangebyscore a -inf +inf", "a:z"), ("zrevrangebyscore a +inf -inf", "a:z"),
 ("zrangebylex a - +", "a:z"), ("zrevrangebylex a + -", "a:z"), ("zrevrange a 0 -1", "a:z"),
 ("zrangestore d a 0 -1", "a:z"), ("zremrangebyrank a 0 0", "a:z"), ("zremrangebyscore a 0 1", "a:z"),
 ("zremrangebylex a - +", "a:z"), ("zpopmin a", "a:z"), ("zpopmax a", "a:z"), ("zmpop 2 a b min", "a:z b:z"),
 ("zrandmember a", "a:z"), ("zrandmember a 2", "a:z"), ("zunion 2 a b", "a:z b:z"), ("zinter 2 a b", "a:z b:z"),
 ("zdiff 2 a b", "a:z b:z"), ("zunionstore d 2 a b", "a:z b:z"), ("zinterstore d 2 a b", "a:z b:z"),
 ("zdiffstore d 2 a b", "a:z b:z"), ("zintercard 2 a b", "a:z b:z"), ("zscan a 0", "a:z"),
 ("geoadd a 13.36 38.11 m", "a:g"), ("geodist a m m", "a:g"), ("geohash a m", "a:g"), ("geopos a m", "a:g"),
 ("georadius a 13 38 100 km", "a:g"), ("georadius a 13 38 100 km store d", "a:g"),
 ("georadius_ro a 13 38 100 km", "a:g"), ("georadiusbymember a m 100 km", "a:g"),
 ("georadiusbymember_ro a m 100 km", "a:g"), ("geosearch a fromlonlat 13 38 byradius 100 km", "a:g"),
 ("geosearch a frommember m byradius 100 km", "a:g"),
 ("geosearchstore d a fromlonlat 13 38 byradius 100 km", "a:g"),
 ("eval \"return redis.call('get',KEYS[1])\" 1 a", "a:s"),
 ("eval \"return 1\" 1 a", "a:s"),
 ("pfdebug getreg a", "a:p"),
]

import shlex
print("%-55s %-14s %-14s %s" % ("command", "missing h/m", "present h/m", "keymiss events (missing | present)"))
for cmdline, types in CASES:
    row = []
    for present in (False, True):
        c.cmd("flushall")
        if present:
            for kt in types.split():
                k, t = kt.split(":"); MK[t](k)
        events()
        h0, m0 = stats()
        args = shlex.split(cmdline)
        rep = c.cmd(*args)
        h1, m1 = stats()
        ev = events()
        row.append(("%d/%d" % (h1 - h0, m1 - m0), ",".join(ev), rep))
    print("%-55s %-14s %-14s %s | %s" % (cmdline, row[0][0], row[1][0], row[0][1], row[1][1]))
