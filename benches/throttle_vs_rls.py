#!/usr/bin/env python3
"""sluice.v1.Throttle beside RLS with one descriptor, on one sluice (memory backend), same run.

Starts `sluice serve` (release build) on a free loopback port with one rule (`user`, a million
per hour: every request is admitted and keeps a state), then runs `sluice bench` against it
ROUNDS times for each service, alternating (RLS, Throttle; then Throttle, RLS; ...), and
prints each run, the medians and the ratio Throttle / RLS (per round, and its median).
Beside the throughput, the server's CPU time per request (user + system from /proc, divided
by the requests its metrics counted, warm-up included): on a shared machine the throughput
swings with other work, the CPU a request costs much less.

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
import urllib.request

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


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def served(admin):
    """Requests counted by sluice: RLS and Throttle, every result."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("sluice_requests_total{", "sluice_throttle_requests_total{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


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
        port, admin = free_port(), free_port()
        server = subprocess.Popen(
            [args.binary, "serve", "--rules", rules, "--grpc-listen", f"127.0.0.1:{port}",
             "--admin-listen", f"127.0.0.1:{admin}"],
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
                    cpu0, n0 = cpu_seconds(server.pid), served(admin)
                    out = subprocess.run(
                        [args.binary, "bench", "--target", f"http://127.0.0.1:{port}",
                         "--duration", f"{args.duration}s", "--warmup", f"{args.warmup}s",
                         *COMMON, *extra], check=True, capture_output=True, text=True)
                    summary = json.loads(out.stdout)
                    summary["cpu_us_per_request"] = (
                        (cpu_seconds(server.pid) - cpu0) * 1e6 / max(1, served(admin) - n0))
                    assert summary["errors"] == 0 and summary["over_limit"] == 0, summary
                    runs[name].append(summary)
                    print(f"round {r + 1} {name:<9} {summary['requests_per_sec']:>9.0f} req/s"
                          f"  p50 {summary['latency_us']['p50']:>6.0f}"
                          f"  p99 {summary['latency_us']['p99']:>6.0f} µs"
                          f"  server CPU {summary['cpu_us_per_request']:.1f} µs/request",
                          flush=True)
        finally:
            server.terminate()
            server.wait(timeout=15)
    rate = {k: [s["requests_per_sec"] for s in v] for k, v in runs.items()}
    ratios = [t / r for t, r in zip(rate["throttle"], rate["rls"])]
    cpu = {k: [s["cpu_us_per_request"] for s in v] for k, v in runs.items()}
    print(f"server CPU per request, medians: rls {statistics.median(cpu['rls']):.1f} µs, "
          f"throttle {statistics.median(cpu['throttle']):.1f} µs; rls / throttle "
          f"{statistics.median(cpu['rls']) / statistics.median(cpu['throttle']):.3f} "
          "(the throughput ratio that CPU cost allows)")
    print(f"median rls      {statistics.median(rate['rls']):>9.0f} req/s")
    print(f"median throttle {statistics.median(rate['throttle']):>9.0f} req/s")
    print(f"throttle / rls: median of medians "
          f"{statistics.median(rate['throttle']) / statistics.median(rate['rls']):.3f}, "
          f"per round {', '.join(f'{x:.3f}' for x in ratios)} "
          f"(median {statistics.median(ratios):.3f})")


if __name__ == "__main__":
    main()
