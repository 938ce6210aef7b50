//! The crate's one source of seeded randomness primitives: SplitMix64 (its step and
//! its finaliser), uniform draws below a bound, and Fisher–Yates shuffles, written
//! once and used by the engine's per-sequence streams ([`SeqRng`](crate::engine::SeqRng)),
//! the data generators, the rollout's selections, the SFT epoch order and the
//! server's fresh seeds.
//!
//! Written here, not taken from `rand`, so a seed gives the same numbers across
//! dependency upgrades: RL users rerun old seeds, and the committed data sets are
//! regenerated from theirs.

/// SplitMix64's increment (the golden ratio in 64 bits).
pub(crate) const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser: a bijection of `u64` whose every output bit depends on
/// every input bit.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A source of uniform 64-bit words, and what every caller draws from it.
pub trait Uniform {
    /// The next 64 uniformly distributed bits.
    fn next_u64(&mut self) -> u64;

    /// Uniform in `0..n` (0 when `n` is 0). The modulo bias is below 2^-40 for the
    /// bounds drawn here (a few thousand at most).
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next_u64() % n as u64) as usize
    }

    /// Fisher–Yates, from the last element down: a uniform permutation.
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }

    /// The first `k` places of a uniform shuffle (Fisher–Yates from the front,
    /// stopped after `k` swaps): `items[..k]` is a uniform sample without
    /// replacement, in random order.
    fn shuffle_first<T>(&mut self, items: &mut [T], k: usize) {
        for i in 0..k.min(items.len()) {
            let j = i + self.below(items.len() - i);
            items.swap(i, j);
        }
    }
}

/// SplitMix64: one add and the finaliser per word; passes BigCrush. The data
/// generators' stream (a seed is one word of state).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The stream for `seed`; equal seeds give equal streams on every machine.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// Uniform in `lo..=hi` (`lo` when `hi < lo`).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }

    /// A uniformly chosen element; `None` for an empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        items.get(self.below(items.len()))
    }

    /// True with probability `percent / 100`.
    pub fn percent(&mut self, percent: u32) -> bool {
        self.below(100) < percent as usize
    }
}

impl Uniform for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that counts 0, 1, 2, …: every draw's outcome is known by hand.
    struct Counting(u64);
    impl Uniform for Counting {
        fn next_u64(&mut self) -> u64 {
            self.0 += 1;
            self.0 - 1
        }
    }

    #[test]
    fn splitmix64_gives_the_reference_values() {
        // Seed 0's first outputs, as the reference C implementation prints them.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn the_shuffles_swap_as_written_by_hand() {
        // Backward: i = 3 takes 0 % 4 = 0, i = 2 takes 1 % 3 = 1, i = 1 takes 2 % 2 = 0.
        let mut v = [10, 11, 12, 13];
        Counting(0).shuffle(&mut v);
        assert_eq!(v, [12, 13, 11, 10]);
        // Forward, two places: i = 0 takes 0 + 5 % 4 = 1, i = 1 takes 1 + 6 % 3 = 1.
        let mut v = [10, 11, 12, 13];
        Counting(5).shuffle_first(&mut v, 2);
        assert_eq!(v, [11, 10, 12, 13]);
        // Asking for more places than there are shuffles them all.
        let mut v = [1, 2];
        Counting(0).shuffle_first(&mut v, 9);
        assert_eq!(v, [1, 2]);
    }
}
