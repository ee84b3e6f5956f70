//! The memory backend's state as one snapshot's bytes, and back (`limiter.persist`: the file,
//! its timer and its writes are the app's; this is only the pure encoding).
//!
//! # Writing
//!
//! [`MemoryLimiter::encode_snapshot`] copies one shard at a time, each under its own lock only
//! while its entries are encoded (a decision waits for at most one shard's copy, never for
//! I/O), then the open reservations under theirs. States already fresh are not written. Every
//! time is written as wall-clock nanoseconds since the Unix epoch (module `codec` says which
//! times move with the clock and which, epoch-aligned windows, do not).
//!
//! # Reading
//!
//! [`MemoryLimiter::restore_snapshot`] checks the header, the length and the checksum, then
//! decodes every entry before it installs any: a snapshot is installed whole or not at all.
//! Times come back onto the limiter's clock; what became fresh while sluice was down is
//! skipped. Keys are state keys: a key whose limit no longer exists is installed all the same
//! and idles out; a state read under another algorithm's key never is (the key names its
//! algorithm).
//!
//! # Format, version 1
//!
//! | bytes | what |
//! |---|---|
//! | 8 | `SLUICEST` |
//! | 2 | version (1), little-endian like every number |
//! | 2 | 0 (reserved) |
//! | 8 | when it was written, wall-clock nanoseconds since the epoch |
//! | 8 | the number of states |
//! | 8 | the number of keys with open reservations |
//! | 8 | the body's length in bytes |
//! | body | each state: tag (1 byte), key length (4), key, when it becomes fresh (8), the state's fields (`codec`); then each key's reservations: key length, key, records |
//! | 4 | CRC-32 (IEEE) of every byte before it |

mod codec;

use codec::{Bad, Reader, Shift};

use super::store::Kind;
use super::{Clock, MemoryLimiter};
use crate::limiter::algorithm::State;
use crate::limiter::reserve::Records;

/// The first bytes of every snapshot.
const MAGIC: &[u8; 8] = b"SLUICEST";
/// The version this build writes and reads.
pub const SNAPSHOT_VERSION: u16 = 2;
/// The header's length: magic, version, reserved, written at, two counts, body length.
const HEADER: usize = 8 + 2 + 2 + 8 + 8 + 8 + 8;
/// The checksum's length.
const TRAILER: usize = 4;

/// Why a snapshot was refused (nothing of it is installed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a sluice snapshot (it does not start with SLUICEST)")]
    NotASnapshot,
    #[error("snapshot version {0}, this sluice reads version {SNAPSHOT_VERSION}")]
    Version(u16),
    #[error("truncated: {len} bytes, where the header announces {expected}")]
    Truncated { len: usize, expected: usize },
    #[error("{extra} bytes past the end the header announces")]
    TooLong { extra: usize },
    #[error(
        "checksum mismatch (stored {stored:08x}, computed {computed:08x}): the file is corrupt"
    )]
    Checksum { stored: u32, computed: u32 },
    #[error("malformed at byte {at}: {what}")]
    Malformed { at: usize, what: String },
}

impl From<Bad> for SnapshotError {
    fn from(bad: Bad) -> SnapshotError {
        SnapshotError::Malformed {
            at: bad.at,
            what: bad.what,
        }
    }
}

/// What a snapshot restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// States installed.
    pub states: usize,
    /// Keys with open reservations installed.
    pub reservations: usize,
    /// States (and reservation keys) that had become fresh since, not installed.
    pub expired: usize,
    /// When the snapshot was written, wall-clock nanoseconds since the epoch.
    pub written_at: u64,
}

/// One state read from a snapshot, its key borrowed from the bytes.
struct Entry<'a> {
    kind: Kind,
    key: &'a [u8],
    fresh_at: u64,
    state: State,
}

impl<C: Clock> MemoryLimiter<C> {
    /// Every state not fresh and every open reservation, as a snapshot's bytes. `wall_now` is
    /// the wall clock now (nanoseconds since the epoch), to which times are converted.
    pub fn encode_snapshot(&self, wall_now: u64) -> Vec<u8> {
        let to_wall = Shift::between(self.clock.now_nanos(), wall_now);
        let mut out = Vec::with_capacity(HEADER + 64 * self.len() + TRAILER);
        out.resize(HEADER, 0);
        let mut states = 0u64;
        // Keys whose state keeps epoch-aligned times: their reservations' marks are too.
        let mut aligned = std::collections::HashSet::new();
        for shard in 0..self.shards.count() {
            self.shards.with_shard(shard, |store| {
                let now = self.clock.now_nanos();
                store.each_timed(&mut |key, fresh_at, state| {
                    if fresh_at > now {
                        states += u64::from(put_entry(&mut out, key, fresh_at, &state, to_wall));
                        if codec::tag_of(&state).is_some_and(|(_, a)| a) {
                            aligned.insert(key.to_vec());
                        }
                    }
                });
            });
        }
        let mut reservations = 0u64;
        let now = self.clock.now_nanos();
        self.reservations.each(&mut |key, records| {
            let mut live = records.clone();
            live.expire(now);
            if !live.is_empty() {
                codec::put_len(&mut out, key.len());
                out.extend_from_slice(key);
                codec::put_records(&mut out, &live, to_wall, aligned.contains(key));
                reservations += 1;
            }
        });
        let body = (out.len() - HEADER) as u64;
        let mut header = Vec::with_capacity(HEADER);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        header.extend_from_slice(&0u16.to_le_bytes());
        for v in [wall_now, states, reservations, body] {
            codec::put_u64(&mut header, v);
        }
        out[..HEADER].copy_from_slice(&header);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Installs a snapshot's states and reservations, all of them or (on any error) none.
    /// `wall_now` is the wall clock now (nanoseconds since the epoch), from which times are
    /// brought back onto the limiter's clock. Meant for a limiter that holds nothing yet (a
    /// state held already is overwritten).
    pub fn restore_snapshot(&self, bytes: &[u8], wall_now: u64) -> Result<Restored, SnapshotError> {
        let now = self.clock.now_nanos();
        let from_wall = Shift::between(wall_now, now);
        let (header, body) = split(bytes)?;
        let (entries, reservations) = decode(header, body, from_wall)?;
        let mut restored = Restored {
            states: 0,
            reservations: 0,
            expired: 0,
            written_at: header.written_at,
        };
        for entry in entries {
            if entry.fresh_at <= now {
                restored.expired += 1;
            } else {
                self.install(&entry, now);
                restored.states += 1;
            }
        }
        for (key, mut records) in reservations {
            records.expire(now);
            if records.is_empty() {
                restored.expired += 1;
            } else {
                self.reservations.install(key, records);
                restored.reservations += 1;
            }
        }
        Ok(restored)
    }

    fn install(&self, entry: &Entry<'_>, now: u64) {
        let (hash, shard) = self.shards.place(entry.key);
        let mut locked = self.shards.lock(std::iter::once(shard));
        if let Some(store) = locked.store(shard) {
            let state = entry.state.clone();
            match store.find(hash, entry.key, entry.kind) {
                Some(found) => store.put(found, entry.fresh_at, state),
                None => store.insert(entry.kind, hash, entry.key, entry.fresh_at, state, now),
            }
        }
    }
}

/// Appends one state; false (nothing written) for a fresh one.
fn put_entry(out: &mut Vec<u8>, key: &[u8], fresh_at: u64, state: &State, to_wall: Shift) -> bool {
    let Some((tag, aligned)) = codec::tag_of(state) else {
        return false;
    };
    let shift = if aligned { Shift(0) } else { to_wall };
    out.push(tag);
    codec::put_len(out, key.len());
    out.extend_from_slice(key);
    codec::put_u64(out, shift.apply(fresh_at));
    codec::put_state(out, state, shift);
    true
}

/// A snapshot's header fields.
#[derive(Debug, Clone, Copy)]
struct Header {
    written_at: u64,
    states: u64,
    reservations: u64,
}

/// Checks the magic, the version, the length and the checksum; the header and the body.
fn split(bytes: &[u8]) -> Result<(Header, &[u8]), SnapshotError> {
    if bytes.len() < MAGIC.len() || bytes.get(..MAGIC.len()) != Some(MAGIC.as_slice()) {
        return Err(SnapshotError::NotASnapshot);
    }
    let mut r = Reader::new(bytes, 0);
    r.take(MAGIC.len())?;
    let version = r
        .u16()
        .map_err(|_| truncated(bytes.len(), HEADER + TRAILER))?;
    if version != SNAPSHOT_VERSION {
        return Err(SnapshotError::Version(version));
    }
    let fields = (|| Ok::<_, Bad>((r.u16()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?)))();
    let (_, written_at, states, reservations, body) =
        fields.map_err(|_| truncated(bytes.len(), HEADER + TRAILER))?;
    let expected = usize::try_from(body)
        .ok()
        .and_then(|b| b.checked_add(HEADER + TRAILER))
        .unwrap_or(usize::MAX);
    if bytes.len() < expected {
        return Err(truncated(bytes.len(), expected));
    }
    if bytes.len() > expected {
        let extra = bytes.len() - expected;
        return Err(SnapshotError::TooLong { extra });
    }
    let (signed, trailer) = bytes.split_at(expected - TRAILER);
    let mut stored = [0; TRAILER];
    stored.copy_from_slice(trailer);
    let stored = u32::from_le_bytes(stored);
    let computed = crc32fast::hash(signed);
    if stored != computed {
        return Err(SnapshotError::Checksum { stored, computed });
    }
    let header = Header {
        written_at,
        states,
        reservations,
    };
    Ok((header, signed.get(HEADER..).unwrap_or_default()))
}

fn truncated(len: usize, expected: usize) -> SnapshotError {
    SnapshotError::Truncated { len, expected }
}

type Decoded<'a> = (Vec<Entry<'a>>, Vec<(&'a [u8], Records)>);

/// Every entry of a body, or the first reason it does not decode.
fn decode(header: Header, body: &[u8], from_wall: Shift) -> Result<Decoded<'_>, SnapshotError> {
    let mut r = Reader::new(body, HEADER);
    // Each state takes at least 13 bytes, each reservation key 16: a count beyond what the
    // body holds is refused by the reads themselves, never allocated for.
    let most = body.len() / 13;
    let mut entries = Vec::with_capacity(usize::try_from(header.states).unwrap_or(0).min(most));
    for _ in 0..header.states {
        let tag = r.u8()?;
        let kind = kind_of(tag).ok_or_else(|| r.bad(format!("unknown state tag {tag}")))?;
        let key_len = r.len(1)?;
        let key = r.take(key_len)?;
        let shift = if codec::aligned(tag) {
            Shift(0)
        } else {
            from_wall
        };
        let fresh_at = shift.apply(r.u64()?);
        let state = codec::get_state(&mut r, tag, shift)?;
        entries.push(Entry {
            kind,
            key,
            fresh_at,
            state,
        });
    }
    let mut reservations = Vec::new();
    for _ in 0..header.reservations {
        let key_len = r.len(1)?;
        let key = r.take(key_len)?;
        reservations.push((key, codec::get_records(&mut r, from_wall)?));
    }
    if !r.is_empty() {
        return Err(r.bad("bytes left after the last entry".into()).into());
    }
    Ok((entries, reservations))
}

/// The table a state of `tag` goes in.
fn kind_of(tag: u8) -> Option<Kind> {
    use codec::tag;
    Some(match tag {
        tag::FUNNEL => Kind::Funnel,
        tag::TOKEN_BUCKET => Kind::TokenBucket,
        tag::FIXED_WINDOW => Kind::FixedWindow,
        tag::SLIDING_WINDOW => Kind::SlidingWindow,
        tag::SLIDING_LOG => Kind::SlidingLog,
        tag::CONCURRENCY => Kind::Concurrency,
        tag::BLOCKED => Kind::Block,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
