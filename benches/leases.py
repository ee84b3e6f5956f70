#!/usr/bin/env python3
"""Leases on one hot key (docs/redis.md, "Leases"), every figure beside its reference.

One key whose limit admits everything (a funnel of 1,000,000 a second, burst 1,000,000), 1 and
2 sluice processes on one redis-server, `redis.leases` off and on, each process loaded by its
own `sluice bench` (64 in flight on 4 connections); the memory backend (1 process) as the
reference. Rounds are interleaved (memory, off x1, on x1, off x2, on x2, ...), so that a change
in the machine's load hits every target alike. Per run: decisions a second (all processes),
script calls per decision (EVALSHA + EVAL + FCALL from INFO commandstats, over the requests
the bench clients counted) and redis-server CPU per decision (utime + stime from
/proc/<pid>/stat). Prints each run, then the medians.

    cargo build --release
    python3 benches/leases.py --rounds 3 --duration 3
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading

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
    out[i] = e2e.json.loads(done.stdout)


def run(binary, urls, redis, args, warmup=0):
    """One run: every url loaded at once; decisions/s, script calls and Redis CPU per
    decision."""
    if redis:
        e2e.redis_cli(redis[0], "CONFIG", "RESETSTAT")
        cpu0 = e2e.cpu_secs([redis[1]])
    results = [None] * len(urls)
    threads = [threading.Thread(target=bench_hot,
                                args=(binary, u, args.duration, warmup, results, i))
               for i, u in enumerate(urls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = sum(r["requests_per_sec"] for r in results)
    # Measured runs have no warm-up (each target was warmed once before the rounds), so what
    # INFO and /proc count is what the clients counted.
    total = sum(r["requests"] for r in results)
    row = {"decisions_per_sec": rate}
    if redis:
        calls = sum(e2e.script_command_calls(redis[0]).values())
        row["script_calls_per_decision"] = calls / total
        row["redis_cpu_us_per_decision"] = (e2e.cpu_secs([redis[1]]) - cpu0) * 1e6 / total
    return row


def main():
    p = argparse.ArgumentParser()
    default = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "sluice")
    p.add_argument("--binary", default=default)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=3)
    p.add_argument("--warmup", type=float, default=1, help="once per target, before the rounds")
    args = p.parse_args()
    binary = os.path.abspath(args.binary)
    rules = os.path.join(tempfile.mkdtemp(), "hot.yaml")
    with open(rules, "w") as f:
        f.write(RULES)
    print(f"machine: {os.cpu_count()} CPUs, load average before {e2e.load()}")
    procs = e2e.Procs()
    try:
        port = e2e.free_port()
        redis = procs.start(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no"], port, "redis-server")
        e2e.REDIS_PORT = port
        url = f"redis://127.0.0.1:{port}"
        memory = e2e.serve(procs, binary, rules)[0]
        off = [e2e.serve(procs, binary, rules, "redis", url)[0] for _ in range(2)]
        on = [e2e.serve(procs, binary, rules, "redis", url, {"SLUICE_REDIS__LEASES": "on"})[0]
              for _ in range(2)]
        targets = [("memory x1", [memory], None), ("leases off x1", off[:1], (port, redis.pid)),
                   ("leases on x1", on[:1], (port, redis.pid)),
                   ("leases off x2", off, (port, redis.pid)),
                   ("leases on x2", on, (port, redis.pid))]
        for _, urls, red in targets:
            run(binary, urls, red, args, args.warmup)
        runs = {name: [] for name, _, _ in targets}
        for r in range(args.rounds):
            for name, urls, red in targets:
                row = run(binary, urls, red, args)
                runs[name].append(row)
                print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items()))
        print("\nmedians:")
        for name, rows in runs.items():
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            print(f"  {name}: " + ", ".join(f"{k} {v:.4g}" for k, v in med.items()))
        print(f"load average after {e2e.load()}")
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
