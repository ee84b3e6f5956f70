//! The bytes of one shard's keys, one after the other in a single buffer. A table entry names
//! its key by a [`Span`] (8 bytes) instead of owning an allocation: no pointer, no length
//! beside it, no allocator header or rounding per key. Removing a key only counts its bytes
//! as dead; the owner rewrites the buffer (see `Store::tidy`) once more of it is dead than
//! live, so that each removed byte is copied at most once on average.

/// The least an arena grows by, in bytes.
const MIN_GROWTH: usize = 256;

/// Where one key's bytes are in its shard's [`Arena`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    start: u32,
    len: u32,
}

impl Span {
    pub(super) fn len(self) -> usize {
        self.len as usize
    }
}

/// The buffer of a shard's keys, and how many of its bytes belong to removed keys.
#[derive(Debug, Default)]
pub(super) struct Arena {
    bytes: Vec<u8>,
    dead: usize,
}

impl Arena {
    /// The bytes of the key at `span` (empty for a span of another arena).
    pub(super) fn get(&self, span: Span) -> &[u8] {
        let start = span.start as usize;
        self.bytes
            .get(start..start + span.len())
            .unwrap_or_default()
    }

    /// Appends a key; `None` when the buffer would pass 4 GiB (spans are 32-bit).
    pub(super) fn push(&mut self, key: &[u8]) -> Option<Span> {
        let start = u32::try_from(self.bytes.len()).ok()?;
        let len = u32::try_from(key.len()).ok()?;
        start.checked_add(len)?;
        if self.bytes.capacity() - self.bytes.len() < key.len() {
            // Grows by half (not double) to keep unused room small; still amortised O(1).
            let grow = (self.bytes.len() / 2).max(key.len()).max(MIN_GROWTH);
            self.bytes.reserve_exact(grow);
        }
        self.bytes.extend_from_slice(key);
        Some(Span { start, len })
    }

    /// Counts a removed key's bytes as dead.
    pub(super) fn free(&mut self, span: Span) {
        self.dead += span.len();
    }

    /// Bytes of removed keys.
    pub(super) fn dead(&self) -> usize {
        self.dead
    }

    /// Bytes of held keys.
    pub(super) fn live(&self) -> usize {
        self.bytes.len().saturating_sub(self.dead)
    }

    /// An empty arena with room for `bytes` bytes of keys.
    pub(super) fn with_capacity(bytes: usize) -> Arena {
        Arena {
            bytes: Vec::with_capacity(bytes),
            dead: 0,
        }
    }

    /// Forgets every key (their spans become invalid), keeping the buffer.
    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.dead = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_give_back_the_bytes_pushed() {
        let mut arena = Arena::default();
        let a = arena.push(b"alpha").unwrap();
        let empty = arena.push(b"").unwrap();
        let b = arena.push(b"beta").unwrap();
        assert_eq!(
            (arena.get(a), arena.get(empty), arena.get(b)),
            (&b"alpha"[..], &b""[..], &b"beta"[..])
        );
        assert_eq!(arena.live(), 9);
        arena.free(a);
        assert_eq!((arena.live(), arena.dead()), (4, 5));
        arena.clear();
        assert_eq!((arena.live(), arena.dead(), arena.get(b)), (0, 0, &b""[..]));
    }
}
