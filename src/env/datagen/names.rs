//! Invented names from syllable combinators. Every generated word is unique
//! (case-insensitively) within one generator, so a name token points at one
//! entity and retrieval questions have one right document.

use std::collections::BTreeSet;

use crate::env::datagen::rng::Rng;

const ONSETS: &[&str] = &[
    "b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "pr", "r", "s",
    "st", "t", "tr", "v", "w", "z", "th", "sh",
];
const VOWELS: &[&str] = &["a", "e", "i", "o", "u", "a", "e", "o", "ae", "ei", "ou"];
const CODAS: &[&str] = &["", "", "", "n", "r", "l", "m", "s", "th", "nd", "st", "x"];

/// Makes unique invented words.
#[derive(Debug, Default)]
pub struct NameGen {
    used: BTreeSet<String>,
}

impl NameGen {
    /// A generator that has produced no word yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn syllable(rng: &mut Rng) -> String {
        let parts = [ONSETS, VOWELS, CODAS].map(|list| rng.pick(list).copied().unwrap_or(""));
        parts.concat()
    }

    /// A capitalised two-syllable word of five to nine letters (shorter
    /// ones risk being real English words, longer ones are unreadable),
    /// never seen before by this generator. Gives up on uniqueness after
    /// many tries by appending a counter, which keeps generation total for
    /// absurd sizes.
    pub fn word(&mut self, rng: &mut Rng) -> String {
        for _ in 0..1000 {
            let w: String = (0..2).map(|_| Self::syllable(rng)).collect();
            if (5..=9).contains(&w.len()) && self.used.insert(w.clone()) {
                return capitalise(&w);
            }
        }
        let w = format!("zan{}", self.used.len());
        self.used.insert(w.clone());
        capitalise(&w)
    }
}

/// First letter upper-case.
pub fn capitalise(w: &str) -> String {
    let mut c = w.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}
