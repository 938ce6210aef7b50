//! Diversity at the fork: how a tree branch's first tokens — the ones that make it a
//! branch — are drawn from a wider distribution than the policy's, so siblings part
//! where they fork instead of repeating each other.
//!
//! On a peaked policy most branches repeat their sibling token for token (65–75% of a
//! warm-started policy's leaves did at T = 1), and a global temperature that breaks
//! the ties lowers every step's quality. The method's remedy is a higher temperature
//! or a top-k at the branch point only: root chains and every token after the boosted
//! span keep the run's sampling. TreeRL's recipe is a preset: with probability 0.5 a
//! branch's first token is drawn at T = 5 from the 16 most likely (`treerl`).
//!
//! Boosted tokens are off-policy: each records its behaviour log-probability (the
//! distribution it was drawn from, truncation renormalised) beside the policy's, and
//! the update's truncated importance weight divides by it (or masks them out).
//!
//! A setting reads and prints as a spec string — the CLI's `--branch-sampling`, the
//! server's and Python's `branch_sampling`, a comparison arm's `-b<spec>` suffix:
//! `t<T>` the branch temperature (required), `k<K>` a top-k, `p<P>` a top-p, `n<N>`
//! how many first tokens are boosted (default 1) or `s` the whole first step, `q<Q>`
//! the probability that a branch is boosted at all (default 1). `t2`, `t1.5p0.95s`,
//! `t5k16q0.5` (= `treerl`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::engine::Sampling;
use crate::engine::{BoostedStart, SamplingError, SeqRng};

/// A branch sampling spec that cannot be read or is out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BranchSamplingError {
    /// The spec is not of the grammar in the module docs.
    #[error("branch sampling {spec:?} is not a spec: {why} (e.g. `t2`, `t1.5p0.95s`, `t5k16q0.5`, `treerl`)")]
    Spec {
        /// The spec given.
        spec: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The branch temperature is 0: a greedy branch point cannot differ from a greedy
    /// sibling, and at T = 0 no behaviour probability exists.
    #[error("branch sampling's temperature must be above 0 (the policy's own is used where none is set)")]
    Greedy,
    /// The probability of boosting a branch is outside (0, 1].
    #[error("branch sampling's probability q{0} is outside (0, 1]")]
    Probability(f64),
    /// The boosted tokens' count is 0.
    #[error("branch sampling boosts at least one token (n1 or more, or s: the whole first step)")]
    NoTokens,
    /// The temperature, top-k or top-p is refused by the engine's sampling rule.
    #[error("branch sampling: {0}")]
    Sampling(#[from] SamplingError),
}

/// How much of a branch's first step is drawn from the wider distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchSpan {
    /// The step's first `n` tokens.
    Tokens(usize),
    /// The whole first step.
    Step,
}

/// How a branch's first tokens are drawn (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BranchSampling {
    /// What the boosted tokens are drawn from: a temperature, optionally top-k/top-p.
    pub sampling: Sampling,
    /// How many of the branch's first tokens are boosted.
    pub span: BranchSpan,
    /// The probability that a branch is boosted at all, drawn per branch from its
    /// own seed (TreeRL: 0.5); 1: every branch.
    pub probability: f64,
}

impl BranchSampling {
    /// TreeRL's first-token recipe (`first_token_temperature`): with probability 0.5
    /// the first token at T = 5 from the 16 most likely.
    pub fn treerl() -> Self {
        BranchSampling {
            sampling: Sampling::Random {
                temperature: 5.0,
                top_k: Some(16),
                top_p: None,
                min_p: None,
            },
            span: BranchSpan::Tokens(1),
            probability: 0.5,
        }
    }

    /// The boost branch `seed` (its seed words, as its steps are seeded) gets, if
    /// its coin says so: the first step of a branch of `max_step_tokens` at most.
    pub fn boost_for(&self, seed: &[u64], max_step_tokens: usize) -> Option<BoostedStart> {
        let mut words = seed.to_vec();
        words.push(BOOST_SALT);
        let boosted =
            self.probability >= 1.0 || SeqRng::from_parts(&words).next_f64() < self.probability;
        boosted.then(|| BoostedStart {
            sampling: self.sampling,
            tokens: match self.span {
                BranchSpan::Tokens(n) => n.min(max_step_tokens),
                BranchSpan::Step => max_step_tokens,
            },
        })
    }
}

/// Seed salt of a branch's boost coin (`[seed words…, salt]`).
const BOOST_SALT: u64 = 0xB005;

/// The number after a spec's letter, up to the next letter.
fn number<T: FromStr>(spec: &str, rest: &mut &str) -> Result<T, BranchSamplingError> {
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
        .unwrap_or(rest.len());
    let (n, tail) = rest.split_at(end);
    *rest = tail;
    n.parse().map_err(|_| BranchSamplingError::Spec {
        spec: spec.to_string(),
        why: "a letter without a number after it",
    })
}

impl FromStr for BranchSampling {
    type Err = BranchSamplingError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        if spec == "treerl" {
            return Ok(Self::treerl());
        }
        let bad = |why| BranchSamplingError::Spec {
            spec: spec.to_string(),
            why,
        };
        let (mut t, mut k, mut p, mut span, mut q) = (None, None, None, None, 1.0);
        let mut rest = spec;
        while let Some(c) = rest.chars().next() {
            rest = &rest[c.len_utf8()..];
            match c {
                't' => t = Some(number::<f32>(spec, &mut rest)?),
                'k' => k = Some(number::<i64>(spec, &mut rest)?),
                'p' => p = Some(number::<f32>(spec, &mut rest)?),
                'n' => span = Some(BranchSpan::Tokens(number::<usize>(spec, &mut rest)?)),
                's' => span = Some(BranchSpan::Step),
                'q' => q = number::<f64>(spec, &mut rest)?,
                _ => return Err(bad("letters are t, k, p, n, s and q")),
            }
        }
        let t = t.ok_or_else(|| bad("no temperature (t<T>)"))?;
        if t == 0.0 {
            return Err(BranchSamplingError::Greedy);
        }
        if !(q > 0.0 && q <= 1.0) {
            return Err(BranchSamplingError::Probability(q));
        }
        let span = span.unwrap_or(BranchSpan::Tokens(1));
        if span == BranchSpan::Tokens(0) {
            return Err(BranchSamplingError::NoTokens);
        }
        Ok(BranchSampling {
            sampling: Sampling::new(t, k, p, None)?,
            span,
            probability: q,
        })
    }
}

impl fmt::Display for BranchSampling {
    /// The canonical spec: `t…`, then `k…`, `p…`, the span (`n…` or `s`), `q…`;
    /// the defaults (`n1`, `q1`) left out. It reads back as the same setting.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Sampling::Random {
            temperature,
            top_k,
            top_p,
            ..
        } = self.sampling
        {
            write!(f, "t{temperature}")?;
            if let Some(k) = top_k {
                write!(f, "k{k}")?;
            }
            if let Some(p) = top_p {
                write!(f, "p{p}")?;
            }
        }
        match self.span {
            BranchSpan::Tokens(1) => {}
            BranchSpan::Tokens(n) => write!(f, "n{n}")?,
            BranchSpan::Step => f.write_str("s")?,
        }
        if self.probability < 1.0 {
            write!(f, "q{}", self.probability)?;
        }
        Ok(())
    }
}

impl Serialize for BranchSampling {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for BranchSampling {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spec = String::deserialize(d)?;
        spec.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(spec: &str, canonical: &str) {
        let b: BranchSampling = spec.parse().unwrap();
        assert_eq!(b.to_string(), canonical, "{spec}");
        assert_eq!(canonical.parse::<BranchSampling>().unwrap(), b);
    }

    #[test]
    fn specs_read_and_print() {
        check("t2", "t2");
        check("t1.5p0.95s", "t1.5p0.95s");
        check("q0.5k16t5", "t5k16q0.5");
        check("treerl", "t5k16q0.5");
        check("t3n4", "t3n4");
        check("t3n1", "t3");
        let b: BranchSampling = "t1.5p0.95s".parse().unwrap();
        assert_eq!(b.span, BranchSpan::Step);
        assert_eq!(
            b.sampling,
            Sampling::Random {
                temperature: 1.5,
                top_k: None,
                top_p: Some(0.95),
                min_p: None
            }
        );
    }

    #[test]
    fn bad_specs_are_refused() {
        for spec in ["", "k16", "t", "tx", "t2z", "t2q0", "t2q1.5", "t2n0", "t0"] {
            assert!(spec.parse::<BranchSampling>().is_err(), "{spec}");
        }
        assert!(matches!(
            "t-1".parse::<BranchSampling>(),
            Err(BranchSamplingError::Sampling(SamplingError::Temperature(_)))
        ));
        assert!(matches!(
            "t2p1.5".parse::<BranchSampling>(),
            Err(BranchSamplingError::Sampling(SamplingError::TopP(_)))
        ));
    }

    #[test]
    fn the_coin_boosts_about_its_share_of_branches() {
        let b = BranchSampling::treerl();
        let boosted = (0..4000u64)
            .filter(|&i| b.boost_for(&[0, i / 8, 0, i % 8], 96).is_some())
            .count();
        // Binomial(4000, 0.5): standard deviation ~32.
        assert!((1800..2200).contains(&boosted), "{boosted}");
        let every: BranchSampling = "t2s".parse().unwrap();
        let boost = every.boost_for(&[0, 1, 2, 3], 96).unwrap();
        assert_eq!(boost.tokens, 96);
        assert_eq!(b.boost_for(&[9], 96).map_or(1, |b| b.tokens), 1);
    }
}
