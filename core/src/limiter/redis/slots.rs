//! Redis Cluster slots: the slot of a key, and which master serves each slot, read from a
//! `CLUSTER SLOTS` reply.

use redis::{RedisError, RedisResult, Value};

use super::topology::Node;

/// Hash slots in a Redis Cluster.
pub(super) const SLOTS: u16 = 16384;

/// The slot of `prefix` followed by `key`, where `prefix` holds no `{` (so a hash tag can only
/// be in `key`), without putting them together: CRC16 (XMODEM) of the hash tag (the part
/// between the first `{` and the next `}`, when not empty), else of the whole key, modulo
/// [`SLOTS`].
pub(super) fn prefixed_slot(prefix: &[u8], key: &[u8]) -> u16 {
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = key.get(open + 1..)?;
        let close = rest.iter().position(|&b| b == b'}')?;
        rest.get(..close).filter(|tag| !tag.is_empty())
    });
    match tag {
        Some(tag) => crc16(0, tag) % SLOTS,
        None => crc16(crc16(0, prefix), key) % SLOTS,
    }
}

/// CRC16 (XMODEM) of `bytes`, going on from `crc`.
fn crc16(mut crc: u16, bytes: &[u8]) -> u16 {
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Which master serves each slot.
#[derive(Default)]
pub(super) struct SlotMap {
    /// Per slot, the index of its master in `masters`; `u16::MAX`: not served.
    owners: Vec<u16>,
    masters: Vec<Node>,
}

impl SlotMap {
    /// The master of `slot`, when one serves it.
    pub(super) fn owner(&self, slot: u16) -> Option<&Node> {
        let index = *self.owners.get(usize::from(slot))?;
        self.masters.get(usize::from(index))
    }

    /// The masters, each once.
    pub(super) fn masters(&self) -> &[Node] {
        &self.masters
    }
}

/// `host:port` split at its last colon.
pub(super) fn split(node: &str) -> RedisResult<(String, u16)> {
    node.rsplit_once(':')
        .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
        .ok_or_else(|| {
            RedisError::from((redis::ErrorKind::Client, "not a host:port", node.to_owned()))
        })
}

/// `CLUSTER SLOTS`: per range `[first, last, [ip, port, id, ...], replicas...]`. A master
/// whose ip is empty or `?` is on the host that answered, `asked`.
pub(super) fn parse_slots(reply: &Value, asked: &str) -> RedisResult<SlotMap> {
    let bad = |what: &'static str| RedisError::from((redis::ErrorKind::Parse, what));
    let Value::Array(ranges) = reply else {
        return Err(bad("CLUSTER SLOTS: not an array"));
    };
    let asked_host = asked.rsplit_once(':').map_or(asked, |(h, _)| h);
    let mut map = SlotMap {
        owners: vec![u16::MAX; usize::from(SLOTS)],
        masters: Vec::new(),
    };
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(bad("CLUSTER SLOTS: a range is not an array"));
        };
        let (Some(first), Some(last), Some(Value::Array(master))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return Err(bad("CLUSTER SLOTS: a range without its master"));
        };
        let (first, last): (u16, u16) = (
            redis::from_redis_value_ref(first)?,
            redis::from_redis_value_ref(last)?,
        );
        let host: String = match master.first() {
            Some(v) => redis::from_redis_value_ref(v)?,
            None => String::new(),
        };
        let host = if host.is_empty() || host == "?" {
            asked_host
        } else {
            host.as_str()
        };
        let port: u16 = match master.get(1) {
            Some(v) => redis::from_redis_value_ref(v)?,
            None => return Err(bad("CLUSTER SLOTS: a master without its port")),
        };
        let node: Node = format!("{host}:{port}").into();
        let index = match map.masters.iter().position(|m| *m == node) {
            Some(i) => i,
            None => {
                map.masters.push(node);
                map.masters.len() - 1
            }
        };
        let index = u16::try_from(index).map_err(|_| bad("CLUSTER SLOTS: too many masters"))?;
        for slot in first..=last.min(SLOTS - 1) {
            if let Some(owner) = map.owners.get_mut(usize::from(slot)) {
                *owner = index;
            }
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(key: &[u8]) -> u16 {
        prefixed_slot(b"", key)
    }

    #[test]
    fn slots_are_redis_cluster_slots() {
        // Examples from the Cluster specification, and hash tags.
        assert_eq!(slot(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        let whole = crc16(0, b"foo{}{bar}") % SLOTS;
        assert_eq!(slot(b"foo{}{bar}"), whole, "an empty tag is no tag");
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        for key in [
            "a",
            "sluice:{api|k=v}:funnel:60",
            "{x}y",
            "no tag}{",
            "p:{}x{y}",
        ] {
            let ours = redis::cluster_routing::Slot::new(slot(key.as_bytes()));
            assert_eq!(
                ours,
                Some(redis::cluster_routing::Slot::for_key(key)),
                "{key}"
            );
            let whole = format!("sluice:{key}");
            let apart = prefixed_slot(b"sluice:", key.as_bytes());
            assert_eq!(apart, slot(whole.as_bytes()), "{key}");
        }
    }

    #[test]
    fn cluster_slots_replies_become_a_map() {
        let node = |ip: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(ip.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(5461), node("", 7001)]),
            Value::Array(vec![
                Value::Int(5462),
                Value::Int(16383),
                node("10.0.0.1", 7000),
            ]),
        ]);
        let map = parse_slots(&reply, "10.0.0.9:7009").unwrap();
        assert_eq!(map.owner(0).map(|n| &**n), Some("10.0.0.1:7000"));
        assert_eq!(map.owner(5461).map(|n| &**n), Some("10.0.0.9:7001"));
        assert_eq!(map.owner(16383).map(|n| &**n), Some("10.0.0.1:7000"));
        assert_eq!(map.masters.len(), 2);
        let partial = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(1),
            node("h", 1),
        ])]);
        assert!(parse_slots(&partial, "h:1").unwrap().owner(2).is_none());
        assert!(parse_slots(&Value::Nil, "h:1").is_err());
    }

    #[test]
    fn nodes_split_at_their_last_colon() {
        assert_eq!(
            split("10.0.0.1:7000").unwrap(),
            ("10.0.0.1".to_owned(), 7000)
        );
        assert_eq!(split("::1:7000").unwrap(), ("::1".to_owned(), 7000));
        assert!(split("nohost").is_err());
    }
}
