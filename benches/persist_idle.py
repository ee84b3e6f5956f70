#!/usr/bin/env python3
"""The CPU cost of `limiter.persist`'s snapshots, measured directly (docs/BENCHMARKS.md,
"Persistence").

Serves two sluice release builds on the memory backend, one without persistence and one with
`limiter.persist` (a snapshot every 1000 ms), fills each with KEYS keys (an hour's fixed window
per key, so every key stays held: `sluice bench --spread-order sequential` for DURATION), then
reads each process's CPU time (utime + stime from /proc) over 10 s of idleness, 3 rounds,
alternating. An idle server's CPU is its housekeeping alone, so the difference is the
snapshots'.

    python3 benches/persist_idle.py 100000 8s
    python3 benches/persist_idle.py 1000000 25s
"""

import os
import socket
import subprocess
import sys
import tempfile
import time

BINARY = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "sluice")
RULES = """domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000, algorithm: fixed_window}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_secs(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    keys, duration = int(sys.argv[1]), sys.argv[2]
    d = tempfile.mkdtemp()
    rules = os.path.join(d, "rules.yaml")
    with open(rules, "w") as f:
        f.write(RULES)
    state = os.path.join(d, "state.snapshot")
    procs = {}
    try:
        for name, env in [("memory", {}), ("persist", {"SLUICE_LIMITER__PERSIST": state})]:
            port, admin = free_port(), free_port()
            procs[name] = subprocess.Popen(
                [BINARY, "serve", "--rules", rules, "--grpc-listen", f"127.0.0.1:{port}",
                 "--admin-listen", f"127.0.0.1:{admin}"],
                env={**os.environ, "SLUICE_LOG__LEVEL": "warn",
                     "SLUICE_MEMORY__SWEEP_INTERVAL_SECS": "3600", **env},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
            subprocess.run([BINARY, "bench", "--target", f"http://127.0.0.1:{port}",
                            "--domain", "bench", "--descriptor", "user=x", "--spread",
                            f"user={keys}", "--spread-order", "sequential", "--duration",
                            duration, "--warmup", "0s", "--quiet", "--json"],
                           check=True, capture_output=True)
        time.sleep(2)
        for r in range(3):
            for name, child in procs.items():
                c0, t0 = cpu_secs(child.pid), time.time()
                time.sleep(10)
                c1, t1 = cpu_secs(child.pid), time.time()
                print(f"round {r + 1} {name}: idle CPU {1000 * (c1 - c0) / (t1 - t0):.1f} ms"
                      f" per second", flush=True)
        print(f"snapshot: {os.path.getsize(state)} bytes")
    finally:
        for child in procs.values():
            child.terminate()
            child.wait()


if __name__ == "__main__":
    main()
