#!/usr/bin/env python3
"""Writes the seed inputs of the `request` fuzz target into fuzz/corpus/request/.

An input is one byte of engine options, then frames of [clock step][length: u16 LE][bytes],
the bytes a protobuf-encoded envoy.service.ratelimit.v3.RateLimitRequest (see
fuzz_targets/request.rs). Protobuf is encoded by hand here: varints and length-delimited
fields are all these messages use.
"""
import struct
import sys
from pathlib import Path


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, value):
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def descriptor(entries, limit=None, hits=None, refund=False):
    out = b"".join(field(1, field(1, k) + field(2, v)) for k, v in entries)
    if limit:
        out += field(2, field(1, limit[0]) + field(2, limit[1]))
    if hits is not None:
        out += field(3, field(1, hits) if hits else b"")
    if refund:
        out += field(4, 1)
    return out


def request(domain, descriptors, hits=0):
    out = field(1, domain) + b"".join(field(2, d) for d in descriptors)
    return out + (field(3, hits) if hits else b"")


def seed(flags, frames):
    out = bytes([flags])
    for step, body in frames:
        out += bytes([step]) + struct.pack("<H", len(body)) + body
    return out


SECONDS = 0x80  # clock step: (step & 63) seconds
SEEDS = {
    "ip-burst": seed(0x40, [(0, request("api", [descriptor([("remote_address", "10.0.0.1")])]))] * 7),
    "nested": seed(0xC2, [
        (0, request("api", [descriptor([("a", "1"), ("b", "2"), ("c", "3")])])),
        (SECONDS | 1, request("api", [descriptor([("a", "1"), ("b", "2"), ("c", "x")], hits=2)])),
    ]),
    "plans": seed(0xCE, [
        (0, request("api", [
            descriptor([("remote_address", "10.0.0.2")]),
            descriptor([("user", "u1"), ("plan", "premium")]),
            descriptor([("user", "u1"), ("plan", "pro")], hits=3),
            descriptor([("user", "u2"), ("plan", "free")]),
        ], hits=2)),
        (SECONDS | 10, request("api", [descriptor([("path", "/login")], refund=True)])),
    ]),
    "files": seed(0x81, [
        (0, request("api", [descriptor([("path", "/files/a")]), descriptor([("path", "/files/b")])])),
        (0x41, request("api", [descriptor([("path", "a/xzy/")], hits=0), descriptor([("blocked", "1")])])),
    ]),
    "override": seed(0x07, [
        (0, request("other", [descriptor([("k", "v")], limit=(2, 2)), descriptor([("k", "w")], limit=(1, 7))])),
        (0xFF, request("", [descriptor([("", "v")])])),
    ]),
}

out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent.parent / "corpus/request")
out.mkdir(parents=True, exist_ok=True)
for name, data in SEEDS.items():
    (out / f"seed-{name}").write_bytes(data)
