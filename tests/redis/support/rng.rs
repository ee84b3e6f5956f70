//! A small deterministic generator (xorshift64*), so every run of the random tests replays the
//! same sequences; shared by the Lua script's differential test and the batching tests.

use sluice::config::model::Charge;

pub(crate) struct Rng(pub u64);

impl Rng {
    /// A generator from a seed, mixed first so that nearby seeds start far apart.
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub(crate) fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }

    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// `Charge::Always` with the given chance, else `Charge::Admitted`.
    pub(crate) fn charge(&mut self, always_percent: u64) -> Charge {
        if self.chance(always_percent) {
            Charge::Always
        } else {
            Charge::Admitted
        }
    }
}
