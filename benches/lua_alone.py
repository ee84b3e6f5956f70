#!/usr/bin/env python3
"""The limiter's Lua alone: redis-server's time per script call, without sluice.

Starts a redis-server on a free loopback port, loads the script (or the function library)
made of core/src/limiter/redis/lua/*.lua exactly as core/src/limiter/redis/script/mod.rs makes it, and sends
CALLS calls, each a batch of REQUESTS requests of HITS funnel hits (the shape of
benches/e2e.py's scenarios `one` and `ten` under group commit: each hit on the key of a user
drawn from 10,000, as `sluice bench --spread` draws one per descriptor), pipelined 16 at a time over one connection. Prints Redis's
own `usec_per_call` (INFO commandstats) per call and per request, and redis-server's CPU per
request from /proc (its main thread included, so RESP parsing and the reply too).

    python3 benches/lua_alone.py                   # hits 1 and 10, script and function
    python3 benches/lua_alone.py --hits 10 --requests 24 --calls 4000
    python3 benches/lua_alone.py --floor           # and the floors (scripts doing only the commands)
    python3 benches/lua_alone.py --users 10        # hot keys: keys repeat across a call's requests

SLUICE_LUA_DIR=DIR reads the Lua files from DIR instead (another version, for an A/B).
--floor also sends, with the same KEYS and ARGV, two scripts that do only what any state kept
in Redis costs, without deciding anything: `TIME`, then per distinct key of the call one `GET`
and one `SET ... PX` (the floor of a read and a write per key), or one `MGET` of every key and
then one `SET ... PX` per key (the floor of one read per call and one write per key).
The encoding mirrors script/encode.rs's `encode` (the contract at the top of lua/prelude.lua).
"""

import argparse
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import time

LUA = os.environ.get("SLUICE_LUA_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "core", "src", "limiter", "redis", "lua")
ALGORITHMS = ["funnel", "token_bucket", "fixed_window", "sliding_window", "sliding_log"]
SCRIPT_MAKERS = "for l = 1, tonumber(ARGV[2]) or 0 do MAKERS[ARGV[5 * l - 2]] = true end"
LIBRARY_MAKERS = "MAKERS.f, MAKERS.b, MAKERS.w, MAKERS.s, MAKERS.l = true, true, true, true, true"


def read(name):
    with open(os.path.join(LUA, name + ".lua")) as f:
        return f.read()


def script_source():
    return "".join([read("prelude")] + [read(a) for a in ALGORITHMS] + [read("main")])


def library_source(name):
    prelude = read("prelude").replace(SCRIPT_MAKERS, LIBRARY_MAKERS, 1)
    body = "".join([prelude] + [read(a) for a in ALGORITHMS] + [read("library")])
    return (f"#!lua name={name}\n{body}\nredis.register_function('{name}', function(KEYS, ARGV)\n"
            f"{read('main')}\nend)\n")


# The floors (see --floor): the commands alone, each value read and written as a number.
FLOOR_GET_SET = """
local t = redis.call("TIME")
for s = 1, #KEYS do
  local n = tonumber(redis.call("GET", KEYS[s]) or "0")
  redis.call("SET", KEYS[s], string.format("%d", n + 1), "PX", "3600000")
end
return {}
"""
FLOOR_MGET_SET = """
local t = redis.call("TIME")
local texts = redis.call("MGET", unpack(KEYS))
for s = 1, #KEYS do
  local n = tonumber(texts[s] or "0")
  redis.call("SET", KEYS[s], string.format("%d", n + 1), "PX", "3600000")
end
return {}
"""


def resp(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.s.recv(1 << 16)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def reply(self):
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b":"):
            return rest
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.s.recv(1 << 16)
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data
        if kind == b"*":
            return [self.reply() for _ in range(int(rest))]
        raise RuntimeError(f"unexpected reply {line!r}")

    def call(self, *args):
        self.s.sendall(resp(args))
        return self.reply()

    def pipeline(self, commands):
        self.s.sendall(b"".join(resp(c) for c in commands))
        return [self.reply() for _ in commands]


def encode(batch, limit):
    """KEYS and ARGV of one call: `batch` is a list of requests, each a list of (key, group)
    hits of the one `limit` (algo, quota, period_micros, burst, flags), cost 1, enforced."""
    keys, slot = [], {}
    for request in batch:
        for key, _ in request:
            if key not in slot:
                slot[key] = len(keys) + 1
                keys.append(key)
    argv = ["", "1", *limit, str(len(batch))]
    blob = []
    for request in batch:
        blob.append(struct.pack("<BI", 0, len(request)))
        for key, group in request:
            blob.append(struct.pack("<IIdIB", slot[key], 1, 1.0, group, 0))
    argv.append(b"".join(blob))
    return keys, argv


def cpu_secs(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(conn, pid, head, hits, requests, calls, rng, limit, check=True, users=10000):
    conn.call("CONFIG", "RESETSTAT")
    cpu0, t0 = cpu_secs(pid), time.time()
    sent = 0
    while sent < calls:
        commands = []
        for _ in range(min(16, calls - sent)):
            batch = []
            for _ in range(requests):
                # As `sluice bench --spread user=10000` draws them: each descriptor its own.
                batch.append([(f"{{bench|user=user-{rng.randrange(users)}}}:funnel:3600", g)
                              for g in range(hits)])
            keys, argv = encode(batch, limit)
            commands.append([*head, len(keys), *keys, *argv])
        for reply in conn.pipeline(commands):
            if not check:
                continue
            # The short form: per request its verdict, then remaining and reset per hit (all
            # admitted; a key drawn twice in a request repeats with one item). Packed, 8 bytes
            # a number (an array of integers from a script before that, via SLUICE_LUA_DIR).
            items = len(reply) if isinstance(reply, list) else len(reply) // 8
            if not requests * (3 + hits - 1) <= items <= requests * (1 + 2 * hits):
                raise RuntimeError(f"reply of {items} items")
        sent += len(commands)
    wall, cpu = time.time() - t0, cpu_secs(pid) - cpu0
    stats = conn.call("INFO", "commandstats").decode()
    name = head[0].lower()
    usec = next(float(l.split("usec_per_call=")[1].split(",")[0]) for l in stats.splitlines()
                if l.startswith(f"cmdstat_{name}:"))
    return usec, cpu * 1e6 / (calls * requests), calls * requests / wall


def populate(conn):
    """Every user's key holds a state, as after the warm-up of an end-to-end run: a funnel's
    tat a little ahead of now (1,000,000 per hour: 3.6 ms per request)."""
    now = int(time.time() * 1e6)
    for first in range(0, 10000, 1000):
        conn.pipeline([["SET", f"{{bench|user=user-{u}}}:funnel:3600", str(now + 3600 * (u % 7)),
                        "PX", "3600000"] for u in range(first, first + 1000)])


def instructions(out):
    """The instructions of the newest callgrind dump in `out` (then removed)."""
    dumps = sorted((f for f in os.listdir(out) if f.startswith("cg.out.")),
                   key=lambda f: int(f.rsplit(".", 1)[1]))
    path = os.path.join(out, dumps[-1])
    with open(path) as f:
        total = next(int(l.split()[1]) for l in f if l.startswith(("summary:", "totals:")))
    os.remove(path)
    return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hits", type=int, action="append")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--callgrind", action="store_true",
                   help="run redis-server under valgrind's callgrind and print the instructions it "
                        "executes per request instead of times (independent of the machine's load)")
    p.add_argument("--users", type=int, default=10000,
                   help="draw each hit's user from this many (fewer: keys repeat in a call)")
    p.add_argument("--floor", action="store_true",
                   help="also measure the floors: scripts doing only TIME and GET + SET per key, "
                        "or TIME, one MGET and SET per key")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mkdtemp()
    wrap = (["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.out",
             "--dump-instr=no"] if args.callgrind else [])
    server = subprocess.Popen([*wrap, "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                conn = Conn(port)
                conn.call("PING")
                break
            except (OSError, RuntimeError):
                time.sleep(0.05)
        else:
            sys.exit("redis-server did not start")
        sha = conn.call("SCRIPT", "LOAD", script_source()).decode()
        lib = "sluice_bench"
        conn.call("FUNCTION", "LOAD", "REPLACE", library_source(lib))
        # The bench's rule: 1,000,000 per hour, funnel (burst = quota).
        limit = ["f", "1000000", "3600000000", "1000000", "0"]
        rng = random.Random(7)
        heads = [("", ["EVALSHA", sha]), ("", ["FCALL", lib])]
        if args.floor:
            heads += [(" floor GET+SET", ["EVALSHA", conn.call("SCRIPT", "LOAD", FLOOR_GET_SET)]),
                      (" floor MGET+SET", ["EVALSHA", conn.call("SCRIPT", "LOAD", FLOOR_MGET_SET)])]
        for hits in args.hits or [1, 10]:
            for label, head in heads:
                check = not label
                for r in range(args.rounds):
                    conn.call("FLUSHALL")
                    populate(conn)
                    if args.callgrind:
                        measure(conn, server.pid, head, hits, args.requests, 20, rng, limit, check,
                                args.users)
                        subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True,
                                       capture_output=True)
                        measure(conn, server.pid, head, hits, args.requests, args.calls, rng,
                                limit, check, args.users)
                        subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True,
                                       capture_output=True)
                        ir = instructions(out)
                        print(f"hits {hits:>2} {head[0]:<7}{label} round {r + 1}: "
                              f"{ir / (args.calls * args.requests):,.0f} instructions/request",
                              flush=True)
                        continue
                    usec, cpu, rate = measure(conn, server.pid, head, hits, args.requests,
                                              args.calls, rng, limit, check, args.users)
                    print(f"hits {hits:>2} {head[0]:<7}{label} round {r + 1}: "
                          f"usec_per_call {usec:8.1f}"
                          f" = {usec / args.requests:6.2f} µs/request;"
                          f" redis-server CPU {cpu:6.2f} µs/request; {rate:8.0f} requests/s",
                          flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
