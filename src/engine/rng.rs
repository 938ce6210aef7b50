//! A per-sequence random number generator.
//!
//! Implemented here (SplitMix64 seeding a xoshiro256**), not taken from a crate, so a
//! seed gives the same samples across dependency upgrades: RL users rerun old seeds.

/// Deterministic RNG owned by one sequence.
#[derive(Debug, Clone)]
pub struct SeqRng {
    s: [u64; 4],
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SeqRng {
    /// Seeds from a list of words, e.g. (run seed, prompt, tree, branch).
    pub fn from_parts(parts: &[u64]) -> Self {
        let mut x = 0x005E_ED0F_7EE5_u64;
        for &p in parts {
            x ^= p;
            splitmix64(&mut x);
        }
        let s = [
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
        ];
        SeqRng { s }
    }

    /// Seeded from one word: the same as `from_parts(&[seed])`.
    pub fn new(seed: u64) -> Self {
        Self::from_parts(&[seed])
    }

    /// The next 64 random bits (xoshiro256**).
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}
