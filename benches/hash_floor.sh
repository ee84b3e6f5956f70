#!/bin/bash
# The storage floor of ten-descriptor requests in redis-server alone: per call 24 requests of
# 10 keys (users drawn from 10,000), stored as string keys with a TTL (one MGET, then one
# SET ... PX per key: what sluice's script pays) or as fields of one hash (one HMGET, one HSET
# of every field: no TTL per field in Redis 7.0). Each is one EVAL of 400 calls; "names" is
# the same loop making the key names only, to subtract. Prints ns per ten-key request.
#
#     bash benches/hash_floor.sh
set -euo pipefail
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
CALLS=400
MAKE='math.randomseed(7) for c = 1, '$CALLS' do local names, pairs = {}, {}
  for j = 1, 240 do local n = "u:" .. math.random(10000)
    names[j] = n pairs[2 * j - 1] = n pairs[2 * j] = "1732500000123456" end '
declare -A BODY=(
  [names]='end return 1'
  [strings]='redis.call("MGET", unpack(names))
    for j = 1, 240 do redis.call("SET", names[j], "1732500000123456", "PX", "4") end end return 1'
  [hash]='redis.call("HMGET", "h", unpack(names)) redis.call("HSET", "h", unpack(pairs)) end return 1'
)
for layout in names strings hash; do
  for _ in 1 2 3; do
    start=$(date +%s%N)
    redis-cli -p "$PORT" eval "$MAKE ${BODY[$layout]}" 0 >/dev/null
    end=$(date +%s%N)
    echo "$layout: $(( (end - start) / CALLS / 24 )) ns per ten-key request"
  done
done
