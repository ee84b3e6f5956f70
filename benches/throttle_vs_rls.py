#!/usr/bin/env python3
"""sluice.v1.Throttle beside RLS with one descriptor, on one sluice (memory backend), same run.

Starts `sluice serve` (release build) on a free loopback port with one rule (`user`, a million
per hour: every request is admitted and keeps a state), then runs `sluice bench` against it
ROUNDS times for each service, alternating (RLS, Throttle; then Throttle, RLS; ...), and
prints each run, the medians and the ratio Throttle / RLS (per round, and its median).

The Throttle load asks the same limit of the same kind of key: `--throttle user
--throttle-limit 1000000/3600000/999999` (CL.THROTTLE's max_burst 999999: a million at once),
spread like RLS's over `user-0` .. `user-9999`.

    cargo build --release
    python3 benches/throttle_vs_rls.py --rounds 5 --duration 5
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

RULES = """
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"""

COMMON = ["--connections", "4", "--concurrency", "64", "--threads", "2", "--json", "--quiet",
          "--spread", "user=10000"]
RLS = ["--domain", "bench", "--descriptor", "user=x"]
THROTTLE = ["--throttle", "user", "--throttle-limit", "1000000/3600000/999999"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5)
    parser.add_argument("--warmup", type=float, default=1)
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    parser.add_argument("--binary", default=os.path.join(target, "release", "sluice"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rules = os.path.join(tmp, "rules.yaml")
        with open(rules, "w") as f:
            f.write(RULES)
        port = free_port()
        server = subprocess.Popen(
            [args.binary, "serve", "--rules", rules, "--grpc-listen", f"127.0.0.1:{port}",
             "--admin-listen", f"127.0.0.1:{free_port()}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 20
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if time.time() > deadline:
                        sys.exit("sluice did not listen")
                    time.sleep(0.05)
            runs = {"rls": [], "throttle": []}
            for r in range(args.rounds):
                order = ["rls", "throttle"] if r % 2 == 0 else ["throttle", "rls"]
                for name in order:
                    extra = RLS if name == "rls" else THROTTLE
                    out = subprocess.run(
                        [args.binary, "bench", "--target", f"http://127.0.0.1:{port}",
                         "--duration", f"{args.duration}s", "--warmup", f"{args.warmup}s",
                         *COMMON, *extra], check=True, capture_output=True, text=True)
                    summary = json.loads(out.stdout)
                    assert summary["errors"] == 0 and summary["over_limit"] == 0, summary
                    runs[name].append(summary)
                    print(f"round {r + 1} {name:<9} {summary['requests_per_sec']:>9.0f} req/s"
                          f"  p50 {summary['latency_us']['p50']:>6.0f}"
                          f"  p99 {summary['latency_us']['p99']:>6.0f} µs", flush=True)
        finally:
            server.terminate()
            server.wait(timeout=15)
    rate = {k: [s["requests_per_sec"] for s in v] for k, v in runs.items()}
    ratios = [t / r for t, r in zip(rate["throttle"], rate["rls"])]
    print(f"median rls      {statistics.median(rate['rls']):>9.0f} req/s")
    print(f"median throttle {statistics.median(rate['throttle']):>9.0f} req/s")
    print(f"throttle / rls: median of medians "
          f"{statistics.median(rate['throttle']) / statistics.median(rate['rls']):.3f}, "
          f"per round {', '.join(f'{x:.3f}' for x in ratios)} "
          f"(median {statistics.median(ratios):.3f})")


if __name__ == "__main__":
    main()
