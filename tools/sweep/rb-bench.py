#!/usr/bin/env python3
"""redis-benchmark points per server CPU-second, servers alternating (A B A B ...).

For shapes the lavik-bench sweep does not cover: TLS (`redis-benchmark --tls`) and
PUBLISH with subscribed connections draining the messages. Same method as the sweep:
each server is pinned to `server_cpus`, the client (redis-benchmark, and the subscriber
process) to `client_cpus`; server CPU seconds are utime+stime of all its threads from
/proc/PID/stat before and after each run, so requests per server CPU-second =
requests / (cpu after - cpu before). The run-queue wait of the server's threads
(/proc/PID/task/*/schedstat, 2nd column) and the load average are recorded per run.

    python3 tools/sweep/rb-bench.py tools/sweep/issue16-tls.json
    python3 tools/sweep/rb-bench.py --subscribe HOST PORT N CHANNEL   (internal)

The config is JSON:
  title, out_dir, server_cpus, client_cpus, repeats, requests (per run),
  keys, data_size: the fill (key:%012d, redis-benchmark's own names, every key once),
  tls: {cacert, cert, key}    client side of --tls points,
  setup: [[arg, ...], ...]    redis-cli commands run on every server after the fill,
  servers: [{name, port, tls_port?, command}]  ({port}/{tls_port} substituted),
  points: [{name, conns: [..], tls?: bool, subscribers?: N, channel?: str,
            message_bytes?: N, requests?: N, args: [...]}]  args follow the connection/count options
            of redis-benchmark: ["-t", "get"] or an arbitrary command.
Writes out_dir/results.csv, results.json and summary.md (medians; ratios are the first
server's figure over each other's).
"""
import csv
import json
import os
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime, stime are fields 14, 15 (1-based); after the ')' split they are 12, 13.
    return (int(fields[11]) + int(fields[12])) / HZ


def wait_seconds(pid):
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[1])
        except OSError:
            pass
    return total / 1e9


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cli(port, *args, tls=None):
    cmd = ["redis-cli", "-p", str(port)]
    if tls:
        cmd += ["--tls", "--cacert", tls["cacert"], "--cert", tls["cert"], "--key", tls["key"]]
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True,
                          check=False).stdout.strip()


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def fill(port, keys, size):
    """SET key:%012d to `size` bytes for every key 0..keys-1 (redis-benchmark's -r range)."""
    value = b"x" * size
    data = b"".join(resp("SET", b"key:%012d" % i, value) for i in range(keys))
    p = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=data,
                       capture_output=True, check=False)
    return p.stdout.decode(errors="replace").strip().splitlines()[-1:]


def subscribe_main(host, port, n, channel):
    """Subscriber process: N connections SUBSCRIBEd to channel, draining every byte.
    Prints 'ready' once all are subscribed; on a line on stdin prints bytes received."""
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port))
        s.sendall(resp("SUBSCRIBE", channel))
        socks.append(s)
    confirm = b"*3\r\n$9\r\nsubscribe\r\n$%d\r\n%s\r\n:1\r\n" % (len(channel), channel.encode())
    for s in socks:
        got = b""
        while len(got) < len(confirm):
            got += s.recv(len(confirm) - len(got))
        assert got == confirm, got
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    sel.register(sys.stdin, selectors.EVENT_READ)
    print("ready", flush=True)
    received = 0
    buf = bytearray(1 << 20)
    stop_at = None
    while True:
        timeout = None if stop_at is None else max(0.0, stop_at - time.time())
        events = sel.select(timeout)
        if not events and stop_at is not None:
            break
        for key, _ in events:
            if key.fileobj is sys.stdin:
                sys.stdin.readline()
                sel.unregister(sys.stdin)
                # Drain what is still in flight, then stop after 1 s of silence.
                stop_at = time.time() + 1.0
                continue
            try:
                k = key.fileobj.recv_into(buf)
            except BlockingIOError:
                continue
            received += k
            if stop_at is not None:
                stop_at = time.time() + 1.0
    print(received, flush=True)


def message_frame(channel, message_bytes):
    return len(resp("message", channel, b"x" * message_bytes))


def run_point(cfg, server, pid, point, conns):
    tls = point.get("tls", False)
    port = server["tls_port"] if tls else server["port"]
    cmd = ["taskset", "-c", cfg["client_cpus"], "redis-benchmark", "-h", "127.0.0.1",
           "-p", str(port), "-c", str(conns), "-n", str(point.get("requests", cfg["requests"])),
           "-d", str(cfg["data_size"]), "--csv"]
    if cfg.get("keys"):
        cmd += ["-r", str(cfg["keys"])]
    if tls:
        t = cfg["tls"]
        cmd += ["--tls", "--cacert", t["cacert"], "--cert", t["cert"], "--key", t["key"]]
    args = list(point["args"])
    if point.get("message_bytes"):
        args = [a.replace("__message__", "x" * point["message_bytes"]) for a in args]
    cmd += args
    subs = None
    n_subs = point.get("subscribers", 0)
    if n_subs:
        subs = subprocess.Popen(
            ["taskset", "-c", cfg["client_cpus"], sys.executable, os.path.abspath(__file__),
             "--subscribe", "127.0.0.1", str(server["port"]), str(n_subs), point["channel"]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert subs.stdout.readline().strip() == "ready"
    load = open("/proc/loadavg").read().split()[:3]
    c0, w0 = cpu_seconds(pid), wait_seconds(pid)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    t1 = time.time()
    received = None
    if subs:
        subs.stdin.write("stop\n")
        subs.stdin.flush()
        received = int(subs.stdout.readline().strip())
        subs.wait()
    c1, w1 = cpu_seconds(pid), wait_seconds(pid)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rb_rps = None
    for row in csv.reader(out.stdout.splitlines()):
        if row and row[0] != "test":
            rb_rps = float(row[1])
    n = point.get("requests", cfg["requests"])
    r = {
        "server": server["name"], "point": point["name"], "conns": conns, "tls": tls,
        "requests": n, "seconds": round(t1 - t0, 3), "rps": rb_rps,
        "server_cpu_s": round(c1 - c0, 3),
        "ops_per_server_cpu_s": round(n / max(c1 - c0, 1e-9)),
        "server_wait_s": round(w1 - w0, 3),
        "client_cpu_s": round((ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime), 3),
        "rss_bytes": rss_bytes(pid), "loadavg": " ".join(load),
        "rb_exit": out.returncode, "rb_stderr": out.stderr.strip()[-300:],
    }
    if subs:
        frame = message_frame(point["channel"], point.get("message_bytes", 0))
        r["subscribers"] = n_subs
        r["messages_expected"] = n * n_subs
        r["messages_received"] = received // frame
        r["bytes_left_over"] = received % frame
    return r


def start_server(cfg, s):
    cmd = s["command"].replace("{port}", str(s["port"])).replace(
        "{tls_port}", str(s.get("tls_port", 0)))
    log = open(os.path.join(cfg["out_dir"], f"{s['name']}.log"), "w")
    p = subprocess.Popen(["taskset", "-c", cfg["server_cpus"], "sh", "-c", "exec " + cmd],
                         stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        if cli(s["port"], "PING") == "PONG":
            return p
        if p.poll() is not None:
            sys.exit(f"{s['name']} exited: see its log")
        time.sleep(0.05)
    sys.exit(f"{s['name']} did not answer PING")


def main(path):
    cfg = json.load(open(path))
    os.makedirs(cfg["out_dir"], exist_ok=True)
    procs = {}
    checks = []
    try:
        for s in cfg["servers"]:
            p = start_server(cfg, s)
            procs[s["name"]] = p
            cli(s["port"], "FLUSHALL")
            if cfg.get("keys"):
                tail = fill(s["port"], cfg["keys"], cfg["data_size"])
                db = cli(s["port"], "DBSIZE")
                checks.append(f"{s['name']}: fill {tail}, DBSIZE {db} (want {cfg['keys']})")
            for c in cfg.get("setup", []):
                checks.append(f"{s['name']}: {' '.join(c)[:80]} -> {cli(s['port'], *c)[:60]}")
        rows = []
        for point in cfg["points"]:
            for conns in point["conns"]:
                for rep in range(cfg["repeats"]):
                    for s in cfg["servers"]:
                        r = run_point(cfg, s, procs[s["name"]].pid, point, conns)
                        r["repeat"] = rep
                        rows.append(r)
                        print(json.dumps(r), flush=True)
        for s in cfg["servers"]:
            info = cli(s["port"], "INFO", "memory")
            used = [line for line in info.splitlines() if line.startswith("used_memory:")]
            checks.append(f"{s['name']}: end {used} errorstats: "
                          + cli(s["port"], "INFO", "errorstats").replace("\r\n", " ")[:200])
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    with open(os.path.join(cfg["out_dir"], "results.json"), "w") as f:
        json.dump({"config": cfg, "checks": checks, "runs": rows}, f, indent=1)
    keys = list(rows[0].keys())
    with open(os.path.join(cfg["out_dir"], "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}, key=lambda k: (
            keys.index(k) if k in keys else 99, k)))
        w.writeheader()
        w.writerows(rows)
    names = [s["name"] for s in cfg["servers"]]
    lines = [f"# {cfg['title']}", "", "Checks:", ""] + [f"- {c}" for c in checks] + [""]
    head = "| point | conns | " + " | ".join(
        f"{n} ops/server CPU-s" for n in names) + " | " + " | ".join(
        f"{names[0]} / {n}" for n in names[1:]) + " | " + " | ".join(
        f"{n} ops/s" for n in names) + " | " + " | ".join(
        f"{n} wait s" for n in names) + " |"
    lines += [head, "|" + "---|" * (2 + 4 * len(names) - 1)]
    for point in cfg["points"]:
        for conns in point["conns"]:
            med = {}
            for n in names:
                rs = [r for r in rows if r["server"] == n and r["point"] == point["name"]
                      and r["conns"] == conns]
                med[n] = (statistics.median(r["ops_per_server_cpu_s"] for r in rs),
                          statistics.median(r["rps"] or 0 for r in rs),
                          statistics.median(r["server_wait_s"] for r in rs),
                          [r["ops_per_server_cpu_s"] for r in rs])
            ratios = " | ".join(f"{med[names[0]][0] / med[n][0]:.2f}x" for n in names[1:])
            lines.append(
                f"| {point['name']} | {conns} | "
                + " | ".join(f"{med[n][0]:,.0f} ({', '.join(f'{v:,}' for v in med[n][3])})"
                             for n in names)
                + f" | {ratios} | "
                + " | ".join(f"{med[n][1]:,.0f}" for n in names) + " | "
                + " | ".join(f"{med[n][2]:.2f}" for n in names) + " |")
    subs = [r for r in rows if "subscribers" in r]
    if subs:
        lines += ["", "Subscribers (every message delivered?):", ""]
        for r in subs:
            lines.append(f"- {r['server']} {r['point']} c={r['conns']} rep {r['repeat']}: "
                         f"{r['messages_received']:,} of {r['messages_expected']:,} "
                         f"(+{r['bytes_left_over']} bytes)")
    with open(os.path.join(cfg["out_dir"], "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--subscribe":
        subscribe_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        main(sys.argv[1])
