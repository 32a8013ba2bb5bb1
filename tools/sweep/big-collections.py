#!/usr/bin/env python3
"""One collection of N members per type, on lavik and on redis-server.

Issue 13 (b) and issue 14: one hash of N fields, one set of N members, one list of N
elements used as a queue, one sorted set of N members. For each: fill through the server
(multi-member commands, pipelined; RESTORE of redis-server's DUMP for the hashed and
sorted types, whose member-at-a-time fill would rewrite ~1000 random leaves per command),
then RSS and used_memory, then timed points with
lavik-bench (requests per server CPU-second, server CPU read from /proc), then
single-client probes with exact INFO counter deltas: device bytes written per update in
`appendfsync always` mode (one update at a time, so nothing is shared by group commit),
device reads per LINDEX of the middle / ZRANK of a random member / HGET / SISMEMBER, and
DEL's own server time (INFO commandstats) and its background page release.

Usage (release build; server on CPU 0, client on CPU 1):
  tools/sweep/big-collections.py --lavik target/release/lavik \
      --bench target/release/lavik-bench --n 10000000 --out docs/benchmarks/big-collections
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time

PER_CMD = 1000  # members per fill command
WINDOW = 8  # fill commands in flight


def enc(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if not isinstance(a, bytes):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def _fill(self):
        d = self.s.recv(1 << 20)
        if not d:
            raise EOFError("server closed the connection")
        self.buf += d

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def reply(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t in (b"+", b":"):
            return int(rest) if t == b":" else rest
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._fill()
            v, self.buf = self.buf[:n], self.buf[n + 2:]
            return v
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError("unexpected reply %r" % line)

    def call(self, *args):
        self.s.sendall(enc(*args))
        return self.reply()

    def pipeline(self, cmds):
        """Sends encoded commands keeping WINDOW in flight; returns nothing, raises on error."""
        inflight = 0
        for c in cmds:
            self.s.sendall(c)
            inflight += 1
            if inflight >= WINDOW:
                self.reply()
                inflight -= 1
        for _ in range(inflight):
            self.reply()


def info(c, section="all"):
    text = c.call("INFO", section).decode()
    out = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.split(":", 1)
            out[k] = v
    return out


def num(d, k):
    try:
        return float(d.get(k, "0"))
    except ValueError:
        return 0.0


def cmdstat(d, name):
    v = d.get("cmdstat_" + name)
    if not v:
        return 0, 0
    f = dict(p.split("=") for p in v.split(","))
    return int(f["calls"]), int(f["usec"])


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def wait_up(port, proc, secs=120):
    end = time.time() + secs
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError("server exited with %s" % proc.returncode)
        try:
            c = Conn(port)
            if c.call("PING") == b"PONG":
                return c
        except (OSError, RuntimeError, EOFError):
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not come up")


def fill_cmds(kind, key, n, vsize):
    pad = b"v" * max(0, vsize - 12)
    for start in range(1, n + 1, PER_CMD):
        end = min(n, start + PER_CMD - 1)
        if kind == "hash":
            args = [b"HSET", key]
            for i in range(start, end + 1):
                args += [b"f:%d" % i, b"%s%010d" % (pad, i)]
        elif kind == "set":
            args = [b"SADD", key] + [b"m:%d" % i for i in range(start, end + 1)]
        elif kind == "list":
            args = [b"RPUSH", key] + [b"%s%010d" % (pad, i) for i in range(start, end + 1)]
        else:
            args = [b"ZADD", key]
            for i in range(start, end + 1):
                args += [b"%d" % ((i * 2654435761) % 1000000007), b"m:%d" % i]
        yield enc(*args)


def bench_point(args, port, pid, command, prefix, kmax, read, secs, conns):
    cmdline = [
        "taskset", "-c", args.client_cpu, args.bench, "-s", "127.0.0.1", "-p", str(port),
        "-t", "1", "-c", str(conns), "--test-time=%d" % secs, "--command=" + command,
        "--command-key-pattern=R", "--pipeline=1", "--key-minimum=1",
        "--key-maximum=%d" % kmax, "--key-prefix=" + prefix, "-d", str(args.vsize),
        "--distinct-client-seed", "--hide-histogram",
    ]
    if read:
        cmdline.append("--command-is-read")
    c = Conn(port)
    before = info(c)
    cpu0 = cpu_seconds(pid)
    t0 = time.time()
    r = subprocess.run(cmdline, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wall = time.time() - t0
    cpu1 = cpu_seconds(pid)
    after = info(c)
    if r.returncode != 0:
        sys.stderr.write(r.stdout.decode(errors="replace"))
        raise RuntimeError("lavik-bench failed: %s" % command)
    calls = 0
    for name in set(w.split()[0].lower() for w in command.split(";")):
        calls += cmdstat(after, name)[0] - cmdstat(before, name)[0]
    cpu = cpu1 - cpu0
    return {
        "command": command,
        "connections": conns,
        "calls": calls,
        "wall_s": round(wall, 2),
        "server_cpu_s": round(cpu, 3),
        "calls_per_s": round(calls / wall),
        "calls_per_cpu_s": round(calls / cpu) if cpu > 0 else None,
        "device_write_bytes_per_call": round(
            (num(after, "lavik_device_write_bytes") - num(before, "lavik_device_write_bytes"))
            / max(calls, 1)),
        # Record bytes defrag appended meanwhile (part of the above; 0 before the counter).
        "defrag_write_bytes_per_call": round(
            (num(after, "lavik_defrag_write_bytes") - num(before, "lavik_defrag_write_bytes"))
            / max(calls, 1)),
    }


def reads_of(d):
    return {k: num(d, k) for k in
            ("lavik_parked_reads", "lavik_restart_reads", "lavik_sync_reads",
             "lavik_cache_misses")}


def probe(c, cmds, lavik):
    """Runs commands one at a time; returns counter deltas per command."""
    before = info(c) if lavik else None
    t0 = time.time()
    for a in cmds:
        c.call(*a)
    wall = time.time() - t0
    out = {"commands": len(cmds), "us_per_command_wall": round(wall * 1e6 / len(cmds), 1)}
    if lavik:
        time.sleep(0.3)
        after = info(c)
        b, a = reads_of(before), reads_of(after)
        for k in b:
            out[k + "_per_command"] = round((a[k] - b[k]) / len(cmds), 2)
        out["device_write_bytes_per_command"] = round(
            (num(after, "lavik_device_write_bytes") - num(before, "lavik_device_write_bytes"))
            / len(cmds))
        out["defrag_write_bytes_per_command"] = round(
            (num(after, "lavik_defrag_write_bytes") - num(before, "lavik_defrag_write_bytes"))
            / len(cmds))
    return out


SPEC = {
    "hash": ("bighash", "HLEN",
             [("HGET bighash __key__", "f:", True), ("HSET bighash __key__ __data__", "f:", False)]),
    "set": ("bigset", "SCARD",
            [("SISMEMBER bigset __key__", "m:", True), ("SADD bigset __key__", "n:", False)]),
    "list": ("biglist", "LLEN",
             [("RPUSH biglist __data__ ; LPOP biglist", "x:", False)]),
    "zset": ("bigz", "ZCARD",
             [("ZSCORE bigz __key__", "m:", True), ("ZADD bigz 7 __key__", "n:", False)]),
}


def probes(kind, c, n, lavik, rng):
    key = SPEC[kind][0].encode()
    res = {}
    if kind == "hash":
        res["HGET random field"] = probe(c, [(b"HGET", key, b"f:%d" % rng.randint(1, n)) for _ in range(200)], lavik)
        res["HSET existing field (always)"] = probe(c, [(b"HSET", key, b"f:%d" % rng.randint(1, n), b"w" * 16) for _ in range(200)], lavik)
        res["HSET new field (always)"] = probe(c, [(b"HSET", key, b"g:%d" % i, b"w" * 16) for i in range(200)], lavik)
        res["HDEL (always)"] = probe(c, [(b"HDEL", key, b"g:%d" % i) for i in range(200)], lavik)
    elif kind == "set":
        res["SISMEMBER random member"] = probe(c, [(b"SISMEMBER", key, b"m:%d" % rng.randint(1, n)) for _ in range(200)], lavik)
        res["SADD new member (always)"] = probe(c, [(b"SADD", key, b"g:%d" % i) for i in range(200)], lavik)
        res["SREM (always)"] = probe(c, [(b"SREM", key, b"g:%d" % i) for i in range(200)], lavik)
    elif kind == "list":
        res["LINDEX middle"] = probe(c, [(b"LINDEX", key, str(n // 2 + rng.randint(-1000, 1000))) for _ in range(100)], lavik)
        cmds = []
        for i in range(100):
            cmds += [(b"RPUSH", key, b"w" * 16), (b"LPOP", key)]
        res["RPUSH + LPOP pair (always; per command)"] = probe(c, cmds, lavik)
    else:
        res["ZRANK random member"] = probe(c, [(b"ZRANK", key, b"m:%d" % rng.randint(1, n)) for _ in range(100)], lavik)
        res["ZSCORE random member"] = probe(c, [(b"ZSCORE", key, b"m:%d" % rng.randint(1, n)) for _ in range(100)], lavik)
        res["ZADD new member (always)"] = probe(c, [(b"ZADD", key, str(rng.randint(0, 10 ** 9)), b"g:%d" % i) for i in range(200)], lavik)
        res["ZREM (always)"] = probe(c, [(b"ZREM", key, b"g:%d" % i) for i in range(200)], lavik)
    return res


def run_server(args, name, kind, dump=None):
    """Fills, measures and deletes one collection; returns (results, redis DUMP or None)."""
    port = args.port + (0 if name == "lavik" else 1)
    if name == "lavik":
        data = os.path.join(args.tmp, "big-collections.data")
        if os.path.exists(data):
            os.unlink(data)
        cmd = ["taskset", "-c", args.server_cpu, args.lavik, "--bind", "127.0.0.1", "--port",
               str(port), "--threads", "1", "--data-file", data, "--data-file-size",
               args.data_size, "--cache-size", args.cache_size, "--appendfsync", "everysec"]
    else:
        data = None
        cmd = ["taskset", "-c", args.server_cpu, "redis-server", "--port", str(port), "--bind",
               "127.0.0.1", "--save", "", "--appendonly", "no"]
    log = open(os.path.join(args.tmp, "big-collections-%s.log" % name), "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        c = wait_up(port, proc)
        rss0 = rss_mib(proc.pid)
        key = SPEC[kind][0]
        t0 = time.time()
        if name == "lavik" and dump is not None:
            # A member-at-a-time fill of a hashed layout rewrites ~1000 random leaves per
            # command; RESTORE of redis-server's DUMP writes the pages once, in order. The
            # server is then restarted so RSS shows the serving state, not the transient
            # whole value RESTORE builds.
            c.call("RESTORE", key, 0, dump)
            fill_s = time.time() - t0
            c.s.close()
            proc.terminate()
            proc.wait()
            t1 = time.time()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            c = wait_up(port, proc)
            while True:
                try:
                    c.call("DBSIZE")
                    break
                except RuntimeError:
                    time.sleep(0.1)
            restart_s = time.time() - t1
        else:
            Conn(port).pipeline(fill_cmds(kind, key.encode(), args.n, args.vsize))
            fill_s = time.time() - t0
            restart_s = None
        size = c.call(SPEC[kind][1], key)
        if size != args.n:
            raise RuntimeError("%s %s: size %s, expected %d" % (name, kind, size, args.n))
        own_dump = c.call("DUMP", key) if name == "redis" and kind != "list" else None
        time.sleep(2)
        d = info(c)
        r = {
            "server": name, "kind": kind, "n": args.n, "fill_s": round(fill_s, 1),
            "fill_members_per_s": round(args.n / fill_s), "rss_mib_empty": round(rss0, 1),
            "fill": "RESTORE of redis-server's DUMP, then a restart" if restart_s else
                    "%d-member commands, %d in flight" % (PER_CMD, WINDOW),
            "restart_s": round(restart_s, 1) if restart_s else None,
            "rss_mib_filled": round(rss_mib(proc.pid), 1),
            "used_memory_mib": round(num(d, "used_memory") / 2 ** 20, 1),
            "encoding": c.call("OBJECT", "ENCODING", key).decode(),
        }
        if name == "lavik":
            r["data_file_bytes"] = num(d, "lavik_data_file_bytes")
        r["points"] = []
        for command, prefix, read in SPEC[kind][2]:
            kmax = args.n if read else args.n * 2
            for conns in (50,):
                r["points"].append(bench_point(args, port, proc.pid, command, prefix, kmax,
                                               read, args.secs, conns))
        r["rss_mib_after_points"] = round(rss_mib(proc.pid), 1)
        rng = random.Random(7)
        if name == "lavik":
            # Let the background page release of the points finish first (at most 120 s),
            # so the probes' bytes are the commands' own plus defrag's (reported apart).
            t0 = time.time()
            while num(info(c), "lavik_paged_releases_pending") > 0 and time.time() - t0 < 120:
                time.sleep(0.1)
            r["settle_before_probes_s"] = round(time.time() - t0, 1)
            c.call("CONFIG", "SET", "appendfsync", "always")
        r["probes"] = probes(kind, c, args.n, name == "lavik", rng)
        if name == "lavik":
            c.call("CONFIG", "SET", "appendfsync", "everysec")
        c.call("CONFIG", "RESETSTAT")
        t0 = time.time()
        deleted = c.call("DEL", key)
        del_wall = time.time() - t0
        calls, usec = cmdstat(info(c, "commandstats"), "del")
        r["del"] = {"reply": deleted, "server_usec": usec, "calls": calls,
                    "round_trip_ms": round(del_wall * 1000, 3)}
        if name == "lavik":
            t0 = time.time()
            while num(info(c), "lavik_paged_releases_pending") > 0 and time.time() - t0 < 600:
                time.sleep(0.05)
            r["del"]["background_release_s"] = round(time.time() - t0, 2)
        r["rss_mib_end"] = round(rss_mib(proc.pid), 1)
        return r, own_dump
    finally:
        proc.terminate()
        proc.wait()
        log.close()
        if data and os.path.exists(data):
            os.unlink(data)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lavik", required=True)
    p.add_argument("--bench", required=True)
    p.add_argument("--n", type=int, default=10_000_000)
    p.add_argument("--vsize", type=int, default=16)
    p.add_argument("--secs", type=int, default=5)
    p.add_argument("--kinds", default="hash,set,list,zset")
    p.add_argument("--servers", default="redis,lavik")
    p.add_argument("--port", type=int, default=7561)
    p.add_argument("--server-cpu", default="0")
    p.add_argument("--client-cpu", default="1")
    p.add_argument("--data-size", default="8gb")
    p.add_argument("--cache-size", default="0", help="lavik's --cache-size")
    p.add_argument("--tmp", default="/tmp")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    results = json.load(open(path)) if os.path.exists(path) else []
    for kind in args.kinds.split(","):
        dump = None
        for name in args.servers.split(","):
            print("== %s %s" % (name, kind), flush=True)
            r, d = run_server(args, name, kind, dump)
            dump = d or dump
            r["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            r["lavik_cache_size"] = args.cache_size if name == "lavik" else None
            r["loadavg"] = open("/proc/loadavg").read().strip()
            print(json.dumps(r, indent=1), flush=True)
            results = [x for x in results if not (x["server"] == name and x["kind"] == kind)]
            results.append(r)
            json.dump(results, open(path, "w"), indent=1)


if __name__ == "__main__":
    main()
