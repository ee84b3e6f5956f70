#!/usr/bin/env python3
"""End-to-end measurements of docs/BENCHMARKS.md, every figure beside its reference.

Starts, on free loopback ports, the no-op RLS server (`sluice bench --noop-server`), sluice
with the memory backend, and (with --redis) a redis-server and sluice with the Redis backend;
then runs `sluice bench` against each of them in turn, ROUNDS times, interleaved (noop,
memory, redis, noop, memory, redis, ...), so that a change in the machine's load hits every
target alike. Prints each run, then the medians and the ratios to the reference.

    cargo build --release
    python3 benches/e2e.py --rounds 5 --duration 5 --redis
    python3 benches/e2e.py --scenario flood     # memory per key in the server

Options: --binary PATH (default target/release/sluice or $CARGO_TARGET_DIR/release/sluice),
--other NAME=PATH (an extra sluice binary served with the memory backend, e.g. a build
before a change), --scenario one|ten|all|flood, --json FILE (every run, for the record),
--rate R (open loop at R requests/s: latency from each request's due time),
--server-threads N (worker threads of every server under test, the no-op's included),
--redis-functions (with --redis, a second Redis target that calls the function library by FCALL
instead of the script by EVALSHA, on the same redis-server), --other-redis NAME=PATH (an extra
sluice binary served with the Redis backend on the same redis-server, e.g. the build before a
change; NAME=PATH@N sets its redis.connections to N), --redis-connections N (redis.connections of this build's Redis targets; not passed to
--other-redis binaries, which may predate the setting), --spread N (the user values spread
over, 10,000 by default), --algorithm NAME (the rule's algorithm; the rules' default
otherwise), --persist (a target `persist`: this build on the memory backend with
limiter.persist set, written every --persist-interval-ms, 1000 by default; compared with
`memory` round by round).

    python3 benches/e2e.py --scenario one --rounds 7 --persist --algorithm fixed_window \
        --spread 100000

Scenario `serial` is one request in flight on one connection (1 descriptor): the latency of a
request alone. Every Redis run also reports the limiter's script calls per request during the
run (FCALL + EVALSHA + EVAL from redis-server's INFO commandstats, over sluice's own count of
requests), which shows group commit at work: 1 when requests come one at a time, much less
when many are in flight.
"""

import argparse
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

RULES = """
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, what, limit=20):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen on port {port}")


class Procs:
    def __init__(self):
        self.children = []

    def start(self, args, port, what, env=None):
        child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env={**os.environ, **(env or {})})
        self.children.append(child)
        wait_port(port, what)
        return child

    def stop(self):
        for c in self.children:
            c.send_signal(signal.SIGTERM)
        for c in self.children:
            try:
                c.wait(timeout=15)
            except subprocess.TimeoutExpired:
                c.kill()


def cpu_secs(pids):
    """User + system CPU time of these processes so far (all their threads)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


SERVER_THREADS = 0


def serve(procs, binary, rules, backend="memory", redis_url=None, env=None):
    port, admin = free_port(), free_port()
    args = [binary, "serve", "--rules", rules, "--grpc-listen", f"127.0.0.1:{port}",
            "--admin-listen", f"127.0.0.1:{admin}", "--backend", backend]
    env = dict(env or {})
    if redis_url:
        args += ["--redis-url", redis_url]
        # Each Redis target keeps its keys apart on the shared redis-server: a build before a
        # change of the stored state's format never reads the other's (nor converts it).
        env.setdefault("SLUICE_REDIS__PREFIX", f"bench{port}:")
    # Only when set: a build from before the setting existed refuses it.
    threads = {"SLUICE_SERVER__WORKER_THREADS": str(SERVER_THREADS)} if SERVER_THREADS else {}
    child = procs.start(args, port, f"sluice ({backend})",
                        {"SLUICE_LOG__LEVEL": "warn", **threads, **env})
    return f"http://127.0.0.1:{port}", admin, child


SPREAD = 10000


def bench(binary, target, scenario, duration, warmup, extra=()):
    descriptors = ["--descriptor", "user=x"] * (10 if scenario == "ten" else 1)
    connections, concurrency = ("1", "1") if scenario == "serial" else ("4", "64")
    args = [binary, "bench", "--target", target, "--domain", "bench", *descriptors,
            "--spread", f"user={SPREAD}", "--connections", connections, "--concurrency", concurrency,
            "--duration", f"{duration}s", "--warmup", f"{warmup}s", "--json", "--quiet",
            *extra]
    # The bench client shares the machine with the servers: its own CPU (from the kernel's
    # account of waited-for children) and the machine's idle time are part of the picture.
    children0, machine0 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_times()
    t0 = time.time()
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    wall = time.time() - t0
    children1, machine1 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_times()
    result = json.loads(out)
    # The whole run's wall time (warm-up included): per-request CPU figures divide by it.
    result["wall_secs"] = wall
    client = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
    # Over the whole run, per request at the mean rate, as the servers'.
    result["client_cpu_us_per_request"] = (
        client * 1e6 / (result["requests_per_sec"] * wall) if result["requests_per_sec"] else None)
    busy, total = machine1[0] - machine0[0], machine1[1] - machine0[1]
    result["machine_idle_share"] = 1 - busy / total if total else None
    return result


def cpu_times():
    """(busy, total) jiffies of the whole machine so far, from /proc/stat (idle and iowait
    are not busy)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    total = sum(fields[:8])
    return total - fields[3] - fields[4], total


def metric(admin, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics").read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def redis_cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], check=True,
                          capture_output=True, text=True).stdout


def script_command_calls(port):
    """Calls of the limiter's Lua per command (fcall, evalsha, eval), from INFO commandstats."""
    calls = {}
    for line in redis_cli(port, "INFO", "commandstats").splitlines():
        for name in ("fcall", "evalsha", "eval"):
            if line.startswith(f"cmdstat_{name}:"):
                calls[name] = int(line.split("calls=")[1].split(",")[0])
    return calls


def load():
    return os.getloadavg()


REDIS_PORT = None


def run_rounds(args, binary, targets, scenario, record):
    runs = {name: [] for name in targets}
    for r in range(args.rounds):
        for name, (url, admin, pids) in targets.items():
            redis = REDIS_PORT if len(pids) > 1 else None
            if redis:
                redis_cli(redis, "CONFIG", "RESETSTAT")
                requests0 = metric(admin, "sluice_requests_total")
            each0 = [cpu_secs([p]) for p in pids]
            extra = ["--rate", str(args.rate)] if args.rate else []
            result = bench(binary, url, scenario, args.duration, args.warmup, extra)
            wall = result["wall_secs"]
            if redis:
                requests = metric(admin, "sluice_requests_total") - requests0
                calls = sum(script_command_calls(redis).values())
                result["script_calls_per_request"] = calls / requests if requests else None
            each = [cpu_secs([p]) - c for p, c in zip(pids, each0)]
            cpu = sum(each)
            result["cpu_us_per_request_by_process"] = [
                c * 1e6 / (result["requests_per_sec"] * wall) for c in each]
            # Server CPU per request, from the whole run (warm-up included) at its mean rate.
            result["server_cpu_us_per_request"] = cpu * 1e6 / (result["requests_per_sec"] * wall)
            result["server_cpu_share"] = cpu / wall
            runs[name].append(result)
            record.append({**result, "scenario": scenario, "round": r, "name": name})
            print(f"  round {r + 1} {name:<12} {result['requests_per_sec']:>9.0f} req/s  "
                  f"p50 {result['latency_us']['p50']:>6.0f}  p99 {result['latency_us']['p99']:>6.0f} µs"
                  f"  ok {result['ok']} over {result['over_limit']} err {result['errors']}"
                  f"  server CPU {result['server_cpu_share']:.2f} cores,"
                  f" {result['server_cpu_us_per_request']:.1f} µs/request"
                  f" {[round(c, 1) for c in result['cpu_us_per_request_by_process']]}"
                  + (f"  client CPU {result['client_cpu_us_per_request']:.1f} µs/request"
                     if result.get("client_cpu_us_per_request") is not None else "")
                  + (f"  machine idle {100 * result['machine_idle_share']:.0f}%"
                     if result.get("machine_idle_share") is not None else "")
                  + (f"  script calls/request {result['script_calls_per_request']:.4f}"
                     if result.get("script_calls_per_request") is not None else ""),
                  flush=True)
    return runs


def medians(runs, reference="noop"):
    ref = runs[reference]
    paired = lambda rs, f: statistics.median(f(r) / f(q) for r, q in zip(rs, ref))
    return {name: {"rps": statistics.median(r["requests_per_sec"] for r in rs),
                   "rps_ratio": paired(rs, lambda r: r["requests_per_sec"]),
                   "p99_ratio": paired(rs, lambda r: r["latency_us"]["p99"]),
                   "cpu_us": statistics.median(r["server_cpu_us_per_request"] for r in rs),
                   "p50": statistics.median(r["latency_us"]["p50"] for r in rs),
                   "p99": statistics.median(r["latency_us"]["p99"] for r in rs),
                   "p99_9": statistics.median(r["latency_us"]["p99_9"] for r in rs),
                   "errors": sum(r["errors"] for r in rs),
                   "client_us": median_of(rs, "client_cpu_us_per_request"),
                   "idle": median_of(rs, "machine_idle_share"),
                   "calls": statistics.median(r["script_calls_per_request"] for r in rs)
                   if all(r.get("script_calls_per_request") is not None for r in rs) else None}
            for name, rs in runs.items()}


def median_of(rs, key):
    values = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(values) if values else None


def report(scenario, runs, reference="noop"):
    m = medians(runs, reference)
    print(f"\n== {scenario}: medians over the rounds; ratios to {reference} are medians of the"
          f" per-round ratios (same round, same machine load)")
    print(f"  {'target':<12} {'req/s':>9} {'ratio':>6} {'p50 µs':>7} {'p99 µs':>7} {'p99 ratio':>9}"
          f" {'p99.9':>7} {'srv CPU µs/req':>14} {'client µs/req':>13} {'idle':>5} errors"
          f"  script calls/request")
    for name, v in m.items():
        calls = f"{v['calls']:.4f}" if v["calls"] is not None else "-"
        client = f"{v['client_us']:.1f}" if v["client_us"] is not None else "-"
        idle = f"{100 * v['idle']:.0f}%" if v["idle"] is not None else "-"
        print(f"  {name:<12} {v['rps']:>9.0f} {v['rps_ratio']:>6.2f} {v['p50']:>7.0f} "
              f"{v['p99']:>7.0f} {v['p99_ratio']:>9.2f} {v['p99_9']:>7.0f} {v['cpu_us']:>14.1f}"
              f" {client:>13} {idle:>5} {v['errors']:>6}  {calls}")
    for name in runs:
        if name.startswith("redis") and "memory" in m:
            ratio = statistics.median(r["requests_per_sec"] / q["requests_per_sec"]
                                      for r, q in zip(runs[name], runs["memory"]))
            print(f"  {name} / memory throughput (median of per-round ratios): {ratio:.2f}")
            # What the same CPU per request would allow with every core busy (no idle time):
            # the cores over the servers' and the client's CPU per request, against memory's
            # measured throughput in the same round.
            busy = [os.cpu_count() * 1e6 / (r["server_cpu_us_per_request"]
                                             + r["client_cpu_us_per_request"])
                    / q["requests_per_sec"] for r, q in zip(runs[name], runs["memory"])
                    if r.get("client_cpu_us_per_request")]
            if busy:
                print(f"  {name} / memory if no core idled (the cores over the CPU per request"
                      f" of sluice, redis-server and the client): {statistics.median(busy):.2f}")
    if "persist" in runs and "memory" in runs:
        paired = lambda f: statistics.median(f(r) / f(q) for r, q in
                                             zip(runs["persist"], runs["memory"]))
        print(f"  persist / memory (median of per-round ratios): throughput"
              f" {paired(lambda r: r['requests_per_sec']):.3f},"
              f" p99 {paired(lambda r: r['latency_us']['p99']):.3f},"
              f" server CPU per request"
              f" {paired(lambda r: r['server_cpu_us_per_request']):.3f}")
    for name in runs:
        if name.startswith("redis") and name != "redis" and "redis" in m:
            paired = lambda f: statistics.median(f(r) / f(q) for r, q in
                                                 zip(runs["redis"], runs[name]))
            print(f"  redis / {name} (median of per-round ratios): throughput"
                  f" {paired(lambda r: r['requests_per_sec']):.2f},"
                  f" p50 {paired(lambda r: r['latency_us']['p50']):.3f},"
                  f" p99 {paired(lambda r: r['latency_us']['p99']):.3f}")


def script_calls(args, binary, redis_port, admin, url, name):
    """Calls of the limiter's Lua (FCALL, EVALSHA, EVAL) per request, counted by Redis, for 1
    and 10 descriptors."""
    for scenario in ("one", "ten"):
        redis_cli(redis_port, "CONFIG", "RESETSTAT")
        before = metric(admin, "sluice_requests_total")
        bench(binary, url, scenario, 2, 0)
        requests = metric(admin, "sluice_requests_total") - before
        calls = script_command_calls(redis_port)
        total = sum(calls.values())
        each = " + ".join(f"{n} {c.upper()}" for c, n in sorted(calls.items()) if n) or "0"
        print(f"  {name} script calls, {scenario} descriptor(s): {each} for "
              f"{requests:.0f} requests = {total / requests:.4f} per request")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def flood(args, binary, rules):
    """1,000,000 keys into a running server; its RSS before and after."""
    procs = Procs()
    try:
        url, admin, child = serve(procs, binary, rules,
                                  env={"SLUICE_MEMORY__MAX_KEYS": "2000000",
                                       "SLUICE_MEMORY__SWEEP_INTERVAL_SECS": "3600"})
        bench(binary, url, "one", 1, 0)  # connections, buffers, allocator warm
        keys0, rss0 = metric(admin, "sluice_memory_keys"), rss_kib(child.pid)
        args_ = [binary, "bench", "--target", url, "--domain", "bench", "--descriptor",
                 "user=x", "--spread", "user=1000000", "--spread-order", "sequential",
                 "--warmup", "0s", "--quiet", "--json"]
        start = 0
        while metric(admin, "sluice_memory_keys") < 1_000_000:
            out = subprocess.run([*args_, "--duration", "5s", "--seed", str(start)], check=True,
                                 capture_output=True, text=True).stdout
            start += json.loads(out)["requests"]
        keys1, rss1 = metric(admin, "sluice_memory_keys"), rss_kib(child.pid)
        per_key = (rss1 - rss0) * 1024 / (keys1 - keys0)
        key_len = len("{bench|user=user-500000}:funnel:3600")
        print(f"  server flood: keys {keys0:.0f} -> {keys1:.0f}, RSS {rss0 / 1024:.1f} -> "
              f"{rss1 / 1024:.1f} MiB: {per_key:.1f} bytes per key (key {key_len} bytes, "
              f"rest {per_key - key_len:.1f})")
    finally:
        procs.stop()


def main():
    p = argparse.ArgumentParser()
    default = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "sluice")
    p.add_argument("--binary", default=default)
    p.add_argument("--other", action="append", default=[])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=5)
    p.add_argument("--warmup", type=float, default=1)
    p.add_argument("--redis", action="store_true")
    p.add_argument("--scenario", default="all",
                   choices=["one", "ten", "serial", "all", "flood"])
    p.add_argument("--other-redis", action="append", default=[])
    p.add_argument("--redis-connections", type=int, default=0)
    p.add_argument("--json")
    p.add_argument("--redis-functions", action="store_true",
                   help="with --redis, also serve the Redis backend with redis.functions = true "
                        "(FCALL of the function library instead of EVALSHA of the script), on the "
                        "same redis-server")
    p.add_argument("--rate", type=float, help="open loop at this rate instead of closed loop")
    p.add_argument("--spread", type=int, default=10000)
    p.add_argument("--algorithm")
    p.add_argument("--persist", action="store_true")
    p.add_argument("--persist-interval-ms", type=int, default=1000)
    p.add_argument("--server-threads", type=int, default=0,
                   help="worker threads of every server under test, the no-op's included "
                        "(server.worker_threads; 0: one per CPU)")
    args = p.parse_args()
    binary = os.path.abspath(args.binary)
    rules = os.path.join(tempfile.mkdtemp(), "bench.yaml")
    with open(rules, "w") as f:
        rate_limit = "requests_per_unit: 1000000"
        if args.algorithm:
            rate_limit += f", algorithm: {args.algorithm}"
        f.write(RULES.replace("requests_per_unit: 1000000", rate_limit))
    global SERVER_THREADS, SPREAD
    SERVER_THREADS = args.server_threads
    SPREAD = args.spread
    print(f"machine: {os.cpu_count()} CPUs, load average before {load()}, "
          f"server worker threads: {args.server_threads or 'one per CPU'}")
    if args.scenario == "flood":
        flood(args, binary, rules)
        print(f"load average after {load()}")
        return
    procs = Procs()
    record = []
    try:
        noop_port = free_port()
        noop_args = [binary, "bench", "--noop-server", f"127.0.0.1:{noop_port}"]
        if args.server_threads:
            noop_args += ["--threads", str(args.server_threads)]
        noop = procs.start(noop_args, noop_port, "no-op server")
        targets = {"noop": (f"http://127.0.0.1:{noop_port}", None, [noop.pid])}
        url, admin, child = serve(procs, binary, rules)
        targets["memory"] = (url, admin, [child.pid])
        if args.persist:
            state = os.path.join(os.path.dirname(rules), "state", "sluice.snapshot")
            url, admin, child = serve(procs, binary, rules, env={
                "SLUICE_LIMITER__PERSIST": state,
                "SLUICE_LIMITER__PERSIST_INTERVAL_MS": str(args.persist_interval_ms)})
            targets["persist"] = (url, admin, [child.pid])
        for other in args.other:
            name, path = other.split("=", 1)
            url, admin, child = serve(procs, os.path.abspath(path), rules)
            targets[name] = (url, admin, [child.pid])
        redis_port = None
        if args.redis:
            redis_port = free_port()
            redis = procs.start(["redis-server", "--port", str(redis_port), "--bind",
                                 "127.0.0.1", "--save", "", "--appendonly", "no"], redis_port,
                                "redis-server")
            global REDIS_PORT
            REDIS_PORT = redis_port
            lanes = ({"SLUICE_REDIS__CONNECTIONS": str(args.redis_connections)}
                     if args.redis_connections else {})
            url, admin, child = serve(procs, binary, rules, "redis",
                                      f"redis://127.0.0.1:{redis_port}", lanes)
            # The server's CPU is sluice's plus redis-server's.
            targets["redis"] = (url, admin, [child.pid, redis.pid])
            for other in args.other_redis:
                name, path = other.split("=", 1)
                path, _, conns = path.partition("@")
                env = {"SLUICE_REDIS__CONNECTIONS": conns} if conns else {}
                url, admin, child = serve(procs, os.path.abspath(path), rules, "redis",
                                          f"redis://127.0.0.1:{redis_port}", env)
                targets[f"redis-{name}"] = (url, admin, [child.pid, redis.pid])
            if args.redis_functions:
                url, admin, child = serve(procs, binary, rules, "redis",
                                          f"redis://127.0.0.1:{redis_port}",
                                          {"SLUICE_REDIS__FUNCTIONS": "true", **lanes})
                targets["redis-functions"] = (url, admin, [child.pid, redis.pid])
        scenarios = ["one", "ten"] if args.scenario == "all" else [args.scenario]
        for scenario in scenarios:
            flight = ("1 in flight on 1 connection" if scenario == "serial"
                      else "64 in flight on 4 connections")
            print(f"\n== scenario {scenario}: {'10 descriptors' if scenario == 'ten' else '1 descriptor'}"
                  f" per request, user spread over 10,000 values, {flight}")
            report(scenario, run_rounds(args, binary, targets, scenario, record))
        for name in ("redis", "redis-functions"):
            if name in targets:
                url, admin, _ = targets[name]
                script_calls(args, binary, redis_port, admin, url, name)
        if redis_port:
            print("  (the redis rows' server CPU is sluice's plus redis-server's, listed apart"
                  " per run above)")
    finally:
        procs.stop()
    if args.persist:
        state = os.path.join(os.path.dirname(rules), "state", "sluice.snapshot")
        if os.path.exists(state):
            print(f"  persist: the last snapshot, {os.path.getsize(state)} bytes")
    print(f"load average after {load()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
