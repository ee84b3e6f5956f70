#!/usr/bin/env python3
"""Leases (docs/redis.md, "Leases"), every figure beside its reference in the same run.

Part 1, one hot key: one key whose limit admits everything (a funnel of 1,000,000 a second,
burst 1,000,000), 1, 2 and 4 sluice processes on one redis-server, `redis.leases` off and on,
each process loaded by its own `sluice bench` (64 in flight on 4 connections); the memory
backend (1 process) as the reference. Rounds are interleaved (memory, off x1, on x1, off x2,
on x2, ...), so that a change in the machine's load hits every target alike. Per run:
decisions a second (all processes), script calls per decision (EVALSHA + EVAL + FCALL from INFO
commandstats, over the requests the bench clients counted), redis-server's and the sluice
processes' CPU per decision (utime + stime from /proc/<pid>/stat), and the share of decisions
answered from leases (sluice's `lease_decided` events). Prints each run, the medians with
their spread (min-max), and the per-round ratios: off / on for redis-server's CPU, on / memory
for one process's throughput.

Part 2, the 10,000-key scenario of benches/e2e.py (one and ten descriptors per request, the
user spread over 10,000 values: leases never engage), with `--before PATH` (the build before
leases existed): targets noop, memory, memory of the build before, Redis leases off, Redis
leases on, Redis of the build before, all on one redis-server, interleaved; the e2e report, then
the paired ratios that say whether anything changed.

    cargo build --release --bin sluice
    python3 benches/leases.py --rounds 5 --duration 3 --before /path/to/before/sluice

The arguments, the binaries and the machine's load are printed first.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402  (the helpers of the end-to-end benchmark)

RULES = """
domain: bench
descriptors:
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 1000000, burst: 1000000}
"""


def bench_hot(binary, url, duration, warmup, out, i):  # noqa: PLR0913
    args = [binary, "bench", "--target", url, "--domain", "bench", "--descriptor", "hot=x",
            "--connections", "4", "--concurrency", "64", "--duration", f"{duration}s",
            "--warmup", f"{warmup}s", "--json", "--quiet"]
    done = subprocess.run(args, check=True, capture_output=True, text=True)
    out[i] = json.loads(done.stdout)


def cpu_ns(pids):
    """Run time of these processes so far, every thread, in nanoseconds (the scheduler's
    account, /proc/<pid>/task/*/schedstat): utime + stime count 10 ms ticks, too coarse for the
    few milliseconds redis-server spends in a run with leases on."""
    total = 0
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:
                pass  # a thread that ended meanwhile
    return total


def script_usec(port):
    """Microseconds redis-server spent running the limiter's Lua (FCALL, EVALSHA, EVAL), from
    INFO commandstats."""
    usec = 0
    for line in e2e.redis_cli(port, "INFO", "commandstats").splitlines():
        for name in ("fcall", "evalsha", "eval"):
            if line.startswith(f"cmdstat_{name}:"):
                usec += int(line.split("usec=")[1].split(",")[0])
    return usec


def lease_decided(admin):
    """Requests this process answered from leases so far (its `lease_decided` events)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics").read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("sluice_backend_events") and 'event="lease_decided"' in line)


def run(binary, servers, redis, args, warmup=0):
    """One run: every server loaded at once by its own client; decisions/s, script calls,
    Redis's and sluice's CPU per decision, the share decided from leases."""
    if redis:
        e2e.redis_cli(redis[0], "CONFIG", "RESETSTAT")
        redis0, redis_ns0 = e2e.cpu_secs([redis[1]]), cpu_ns([redis[1]])
        decided0 = sum(lease_decided(s[1]) for s in servers)
    sluice0 = cpu_ns([s[2].pid for s in servers])
    t0 = time.monotonic()
    results = [None] * len(servers)
    threads = [threading.Thread(target=bench_hot,
                                args=(binary, s[0], args.duration, warmup, results, i))
               for i, s in enumerate(servers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sluice = (cpu_ns([s[2].pid for s in servers]) - sluice0) / 1e9
    wall = time.monotonic() - t0
    rate = sum(r["requests_per_sec"] for r in results)
    # Measured runs have no warm-up (each target was warmed once before the rounds), so what
    # INFO and /proc count is what the clients counted.
    total = sum(r["requests"] for r in results)
    row = {"decisions_per_sec": rate, "sluice_cpu_us_per_decision": sluice * 1e6 / total}
    if redis:
        calls = sum(e2e.script_command_calls(redis[0]).values())
        row["script_calls_per_decision"] = calls / total
        # Of redis-server's CPU, what the scripts themselves ran.
        row["script_us_per_decision"] = script_usec(redis[0]) / total
        redis_ns = cpu_ns([redis[1]]) - redis_ns0
        row["redis_cpu_us_per_decision"] = redis_ns / 1e3 / total
        row["redis_cpu_ms_per_sec"] = redis_ns / 1e6 / wall
        # The same from utime + stime (10 ms ticks).
        row["redis_ticks_us_per_decision"] = (e2e.cpu_secs([redis[1]]) - redis0) * 1e6 / total
        row["leased_share"] = (sum(lease_decided(s[1]) for s in servers) - decided0) / total
    row["over_limit"] = sum(r["over_limit"] for r in results)
    row["errors"] = sum(r["errors"] for r in results)
    return row


def spread(values, fmt):
    med = statistics.median(values)
    return f"{fmt(med)} [{fmt(min(values))}-{fmt(max(values))}]"


def hot_key(args, binary, procs):
    rules = os.path.join(tempfile.mkdtemp(), "hot.yaml")
    with open(rules, "w") as f:
        f.write(RULES)
    counts = sorted({int(n) for n in args.processes.split(",")})
    most = max(counts)
    port = e2e.free_port()
    redis = procs.start(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                         "--save", "", "--appendonly", "no"], port, "redis-server")
    url = f"redis://127.0.0.1:{port}"
    memory = e2e.serve(procs, binary, rules)
    off = [e2e.serve(procs, binary, rules, "redis", url, {"SLUICE_REDIS__LEASES": "off"})
           for _ in range(most)]
    on = [e2e.serve(procs, binary, rules, "redis", url, {"SLUICE_REDIS__LEASES": "on"})
          for _ in range(most)]
    red = (port, redis.pid)
    targets = [("memory x1", [memory], None)]
    for n in counts:
        targets += [(f"off x{n}", off[:n], red), (f"on x{n}", on[:n], red)]
    for other in args.compare:
        # Another build, leases on, one process: e.g. this one before a change to the leases.
        name, path = other.split("=", 1)
        server = e2e.serve(procs, os.path.abspath(path), rules, "redis", url,
                           {"SLUICE_REDIS__LEASES": "on"})
        targets.append((f"{name} on x1", [server], red))
    print(f"\n== hot key: one key (funnel 1,000,000/s, burst 1,000,000), {args.processes} sluice "
          f"processes on one redis-server, 64 in flight on 4 connections per process, "
          f"{args.rounds} rounds x {args.duration} s, interleaved", flush=True)
    for _, servers, r in targets:
        run(binary, servers, r, args, args.warmup)
    runs = {name: [] for name, _, _ in targets}
    idle = []
    for rnd in range(args.rounds):
        # redis-server's floor: its own CPU with every sluice process connected and no load
        # (its timers, sluice's health probes), over a run's length.
        ns0, t0 = cpu_ns([redis.pid]), time.monotonic()
        time.sleep(args.duration)
        idle.append((cpu_ns([redis.pid]) - ns0) / 1e6 / (time.monotonic() - t0))
        print(f"  round {rnd + 1} redis-server idle: {idle[-1]:.3f} ms CPU per second", flush=True)
        for name, servers, r in targets:
            row = run(binary, servers, r, args)
            runs[name].append(row)
            print(f"  round {rnd + 1} {name:<9} " + ", ".join(
                f"{k} {v:.4g}" for k, v in row.items()) + f"  load {e2e.load()[0]:.1f}",
                flush=True)
    print("\n  medians [min-max] over the rounds:")
    print(f"  {'target':<9} {'decisions/s':>26} {'script calls/decision':>29} "
          f"{'redis CPU µs/decision':>24} {'of it, scripts':>22} {'sluice CPU µs/decision':>22} "
          f"{'from leases':>12}")
    for name, rows in runs.items():
        col = lambda k, fmt: (spread([r[k] for r in rows], fmt) if k in rows[0] else "-")
        print(f"  {name:<9} {col('decisions_per_sec', lambda v: f'{v:,.0f}'):>26} "
              f"{col('script_calls_per_decision', lambda v: f'{v:.5f}'):>29} "
              f"{col('redis_cpu_us_per_decision', lambda v: f'{v:.3f}'):>24} "
              f"{col('script_us_per_decision', lambda v: f'{v:.3f}'):>22} "
              f"{col('sluice_cpu_us_per_decision', lambda v: f'{v:.2f}'):>22} "
              f"{col('leased_share', lambda v: f'{100 * v:.2f}%'):>12}")
        errors = sum(r["errors"] + r["over_limit"] for r in rows)
        if errors:
            print(f"    {name}: {errors} requests not admitted or failed")
    print(f"  redis-server idle (no load, every process connected): "
          f"{spread(idle, lambda v: f'{v:.3f}')} ms CPU per second")
    print("\n  per-round ratios, medians [min-max]:")
    paired = lambda a, b, f: [f(x) / f(y) for x, y in zip(runs[a], runs[b])]
    for n in counts:
        cpu = paired(f"off x{n}", f"on x{n}", lambda r: r["redis_cpu_us_per_decision"])
        rps = paired(f"on x{n}", f"off x{n}", lambda r: r["decisions_per_sec"])
        calls = paired(f"off x{n}", f"on x{n}", lambda r: r["script_calls_per_decision"])
        print(f"  x{n}: redis-server CPU per decision off / on {spread(cpu, lambda v: f'{v:.1f}')};"
              f" script calls per decision off / on {spread(calls, lambda v: f'{v:.0f}')};"
              f" decisions/s on / off {spread(rps, lambda v: f'{v:.2f}')}")
        net = [(x["redis_cpu_ms_per_sec"] - i) / x["decisions_per_sec"]
               / max((y["redis_cpu_ms_per_sec"] - i) / y["decisions_per_sec"], 1e-12)
               for x, y, i in zip(runs[f"off x{n}"], runs[f"on x{n}"], idle)]
        print(f"  x{n}: the same less redis-server's idle floor, off / on "
              f"{spread(net, lambda v: f'{v:.1f}')}")
    for name in ("on x1", "off x1", *(f"{o.split('=')[0]} on x1" for o in args.compare)):
        rps = paired(name, "memory x1", lambda r: r["decisions_per_sec"])
        print(f"  {name} / memory x1 decisions/s: {spread(rps, lambda v: f'{v:.3f}')}")
    return runs


def keyed(args, binary, before, procs):
    """The 10,000-key scenarios of benches/e2e.py: this build with leases off and on, and the
    build before, on both backends."""
    rules = os.path.join(tempfile.mkdtemp(), "bench.yaml")
    with open(rules, "w") as f:
        f.write(e2e.RULES)
    noop_port = e2e.free_port()
    noop = procs.start([binary, "bench", "--noop-server", f"127.0.0.1:{noop_port}"], noop_port,
                       "no-op server")
    targets = {"noop": (f"http://127.0.0.1:{noop_port}", None, [noop.pid])}
    url, admin, child = e2e.serve(procs, binary, rules)
    targets["memory"] = (url, admin, [child.pid])
    if before:
        url, admin, child = e2e.serve(procs, before, rules)
        targets["before"] = (url, admin, [child.pid])
    port = e2e.free_port()
    redis = procs.start(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save",
                         "", "--appendonly", "no"], port, "redis-server")
    e2e.REDIS_PORT = port
    redis_url = f"redis://127.0.0.1:{port}"
    for name, env in (("redis", {"SLUICE_REDIS__LEASES": "off"}),
                      ("redis-leases", {"SLUICE_REDIS__LEASES": "on"})):
        url, admin, child = e2e.serve(procs, binary, rules, "redis", redis_url, env)
        targets[name] = (url, admin, [child.pid, redis.pid])
    if before:
        url, admin, child = e2e.serve(procs, before, rules, "redis", redis_url)
        targets["redis-before"] = (url, admin, [child.pid, redis.pid])
    e2e_args = argparse.Namespace(rounds=args.rounds, duration=args.keyed_duration,
                                  warmup=args.keyed_warmup, rate=None)
    out = {}
    for scenario in args.scenarios.split(","):
        print(f"\n== scenario {scenario}: {'10 descriptors' if scenario == 'ten' else '1 descriptor'}"
              " per request, user spread over 10,000 values, 64 in flight on 4 connections",
              flush=True)
        runs = e2e.run_rounds(e2e_args, binary, targets, scenario, [])
        e2e.report(scenario, runs)
        print("  paired per-round ratios, medians [min-max]: throughput; p99; server CPU per "
              "request (the Redis rows' include redis-server's)")
        for a, b in (("before", "memory"), ("redis", "redis-leases"),
                     ("redis-before", "redis"), ("redis-before", "redis-leases")):
            if a not in runs or b not in runs:
                continue
            ratio = lambda f: spread([f(x) / f(y) for x, y in zip(runs[b], runs[a])],
                                     lambda v: f"{v:.3f}")
            print(f"  {b} / {a}: {ratio(lambda r: r['requests_per_sec'])};"
                  f" {ratio(lambda r: r['latency_us']['p99'])};"
                  f" {ratio(lambda r: r['server_cpu_us_per_request'])}")
        out[scenario] = runs
    return out


def main():
    p = argparse.ArgumentParser()
    default = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "sluice")
    p.add_argument("--binary", default=default)
    p.add_argument("--before", help="the build before leases: also the 10,000-key scenarios")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=3, help="seconds per hot-key run")
    p.add_argument("--warmup", type=float, default=1, help="once per hot-key target")
    p.add_argument("--processes", default="1,2,4", help="sluice processes per hot-key target")
    p.add_argument("--keyed-duration", type=float, default=4, help="seconds per 10,000-key run")
    p.add_argument("--keyed-warmup", type=float, default=1, help="per 10,000-key run")
    p.add_argument("--scenarios", default="one,ten", help="10,000-key scenarios")
    p.add_argument("--only", choices=["hot", "keys"], help="one part only")
    p.add_argument("--compare", action="append", default=[],
                   help="NAME=PATH: another build, leases on, 1 process, in the hot-key rounds")
    p.add_argument("--json", help="every run, for the record")
    args = p.parse_args()
    binary = os.path.abspath(args.binary)
    before = os.path.abspath(args.before) if args.before else None
    print("command: " + " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]))
    print(f"arguments: {vars(args)}")
    print(f"binary {binary}" + (f", before {before}" if before else ""))
    print(f"machine: {os.cpu_count()} CPUs, load average before {e2e.load()}", flush=True)
    record = {}
    procs = e2e.Procs()
    try:
        if args.only != "keys":
            record["hot"] = hot_key(args, binary, procs)
    finally:
        procs.stop()
    print(f"load average {e2e.load()}", flush=True)
    procs = e2e.Procs()
    try:
        if args.only != "hot":
            record["keys"] = keyed(args, binary, before, procs)
    finally:
        procs.stop()
    print(f"load average after {e2e.load()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
