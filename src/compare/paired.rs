//! An arm against the baseline as a paired difference: for every seed both ran and
//! every test question both evaluated, the arm's final greedy reward minus the
//! baseline's; their mean, and a 95% interval from a two-level (cluster) bootstrap
//! that resamples seeds and, within each seed drawn, its questions.
//!
//! Pairing removes what the two arms share — how hard a question is, how lucky a
//! seed's prompts were — so a difference too small to see in two means ± spread can
//! show here. Resampling seeds first keeps the interval honest about how few seeds
//! there are: questions within a seed are not independent evidence of a seed's
//! luck. The resamples come from a fixed seed, so the same logs give the same
//! interval. Pure statistics: no I/O.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::engine::SeqRng;

/// Bootstrap resamples behind each interval: enough that the 2.5% and 97.5%
/// quantiles move by well under a reported digit between seeds of the resampler.
pub const RESAMPLES: usize = 10_000;

/// The resampler's seed: fixed, so an interval is reproducible from the files.
const BOOTSTRAP_SEED: u64 = 0x0B00_7572_A9ED;

/// An arm's final evaluation against the baseline's, paired by seed and question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairedDiff {
    /// Mean of `arm − baseline` over every paired (seed, question).
    pub mean_diff: f64,
    /// The 95% interval's lower end (the 2.5% quantile of the bootstrap means).
    pub ci_low: f64,
    /// Its upper end (the 97.5% quantile).
    pub ci_high: f64,
    /// Seeds both arms ran with per-question rewards in their final evaluations.
    pub seeds_paired: usize,
    /// Questions paired in each of those seeds (the fewest, should seeds differ;
    /// they do not when every run evaluates the same test questions).
    pub questions: usize,
    /// The whole interval lies above 0: `ci_low > 0`.
    pub beats_chain: bool,
}

/// `arm − baseline` for every question both evaluated, in `arm`'s order; a question
/// only one of them evaluated is left out.
pub fn pair(arm: &[(&str, f64)], baseline: &[(&str, f64)]) -> Vec<f64> {
    let base: HashMap<&str, f64> = baseline.iter().copied().collect();
    arm.iter()
        .filter_map(|(id, r)| base.get(id).map(|b| r - b))
        .collect()
}

/// The paired difference of per-seed differences `seeds` (one list of question
/// differences per seed; an empty list is a seed with nothing paired and is left
/// out). `None` when nothing is paired.
pub fn paired_difference(seeds: &[Vec<f64>]) -> Option<PairedDiff> {
    let seeds: Vec<&[f64]> = seeds
        .iter()
        .map(Vec::as_slice)
        .filter(|s| !s.is_empty())
        .collect();
    if seeds.is_empty() {
        return None;
    }
    let pairs: usize = seeds.iter().map(|s| s.len()).sum();
    let mean_diff = seeds.iter().flat_map(|s| s.iter()).sum::<f64>() / pairs as f64;
    let mut means = bootstrap_means(&seeds, RESAMPLES, &mut SeqRng::new(BOOTSTRAP_SEED));
    means.sort_by(f64::total_cmp);
    let (ci_low, ci_high) = (quantile(&means, 0.025), quantile(&means, 0.975));
    Some(PairedDiff {
        mean_diff,
        ci_low,
        ci_high,
        seeds_paired: seeds.len(),
        questions: seeds.iter().map(|s| s.len()).min().unwrap_or(0),
        beats_chain: ci_low > 0.0,
    })
}

/// A uniform index below `n` (n > 0).
fn below(rng: &mut SeqRng, n: usize) -> usize {
    // 53 random bits scaled: no modulo bias worth the name at these sizes.
    ((rng.next_f64() * n as f64) as usize).min(n - 1)
}

/// `resamples` means of a two-level resample: as many seeds as there are, drawn with
/// replacement, and for each seed drawn as many of its questions as it has, drawn
/// with replacement; the mean is over every pair drawn, as `mean_diff` is.
fn bootstrap_means(seeds: &[&[f64]], resamples: usize, rng: &mut SeqRng) -> Vec<f64> {
    (0..resamples)
        .map(|_| {
            let (mut sum, mut count) = (0.0, 0usize);
            for _ in 0..seeds.len() {
                let seed = seeds[below(rng, seeds.len())];
                for _ in 0..seed.len() {
                    sum += seed[below(rng, seed.len())];
                }
                count += seed.len();
            }
            sum / count as f64
        })
        .collect()
}

/// The `p` quantile of ascending `sorted` (not empty), interpolated linearly between
/// the order statistics around `p · (n − 1)` (R's type 7, numpy's default).
fn quantile(sorted: &[f64], p: f64) -> f64 {
    let at = p * (sorted.len() - 1) as f64;
    let (lo, frac) = (at.floor() as usize, at.fract());
    match sorted.get(lo + 1) {
        Some(hi) => sorted[lo] + frac * (hi - sorted[lo]),
        None => sorted[lo],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_by_question_id_and_leaves_out_the_unpaired() {
        let arm = [("a", 1.0), ("b", 0.25), ("c", 0.0)];
        let chain = [("b", 0.5), ("a", 0.75)];
        assert_eq!(pair(&arm, &chain), vec![0.25, -0.25]);
        assert_eq!(pair(&arm, &[]), Vec::<f64>::new());
    }

    #[test]
    fn the_mean_is_over_every_pair() {
        // Seed 0: 0.5 and 0.25; seed 1: -0.25. (0.5 + 0.25 - 0.25) / 3 = 1/6.
        let d = paired_difference(&[vec![0.5, 0.25], vec![-0.25], vec![]]).unwrap();
        assert!((d.mean_diff - 1.0 / 6.0).abs() < 1e-15, "{d:?}");
        // The empty seed is not paired; the fewest questions a seed has is 1.
        assert_eq!((d.seeds_paired, d.questions), (2, 1));
        // Every resample mean lies between the smallest and largest difference.
        assert!(-0.25 <= d.ci_low && d.ci_low <= d.mean_diff, "{d:?}");
        assert!(d.mean_diff <= d.ci_high && d.ci_high <= 0.5, "{d:?}");
    }

    #[test]
    fn equal_differences_collapse_the_interval() {
        let d = paired_difference(&[vec![0.25; 4], vec![0.25; 4], vec![0.25; 4]]).unwrap();
        assert_eq!(
            d,
            PairedDiff {
                mean_diff: 0.25,
                ci_low: 0.25,
                ci_high: 0.25,
                seeds_paired: 3,
                questions: 4,
                beats_chain: true,
            }
        );
    }

    #[test]
    fn one_seed_of_two_questions_gives_the_hand_computed_interval() {
        // Resampling [0, 1] gives the means 0, 1/2 and 1 with chances 1/4, 1/2, 1/4:
        // ~2,500 of the 10,000 means are 0 and ~2,500 are 1, so the 2.5% quantile
        // is 0 and the 97.5% quantile 1. An interval that starts at 0 does not beat.
        let d = paired_difference(&[vec![0.0, 1.0]]).unwrap();
        assert_eq!(
            (d.mean_diff, d.ci_low, d.ci_high, d.beats_chain),
            (0.5, 0.0, 1.0, false)
        );
    }

    #[test]
    fn differences_of_both_signs_straddle_zero() {
        let d =
            paired_difference(&[vec![1.0, -1.0, 1.0, -1.0], vec![-1.0, 1.0, -1.0, 1.0]]).unwrap();
        assert_eq!(d.mean_diff, 0.0);
        assert!(d.ci_low < 0.0 && d.ci_high > 0.0, "{d:?}");
        assert!(!d.beats_chain);
        // The same input, the same interval: the resampler's seed is fixed.
        assert_eq!(
            paired_difference(&[vec![1.0, -1.0, 1.0, -1.0], vec![-1.0, 1.0, -1.0, 1.0]]),
            Some(d)
        );
    }

    #[test]
    fn differences_all_above_zero_beat() {
        let d = paired_difference(&[vec![0.25, 0.75], vec![0.5, 0.5]]).unwrap();
        assert_eq!(d.mean_diff, 0.5);
        assert!(
            0.25 <= d.ci_low && d.ci_low < 0.5 && d.ci_high <= 0.75,
            "{d:?}"
        );
        assert!(d.beats_chain);
    }

    #[test]
    fn nothing_paired_is_none() {
        assert_eq!(paired_difference(&[]), None);
        assert_eq!(paired_difference(&[vec![], vec![]]), None);
    }

    #[test]
    fn quantiles_interpolate_between_order_statistics() {
        let v = [0.0, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.0), 0.0);
        assert_eq!(quantile(&v, 0.5), 2.0);
        assert_eq!(quantile(&v, 0.625), 2.5);
        assert_eq!(quantile(&v, 1.0), 4.0);
        assert_eq!(quantile(&[7.0], 0.975), 7.0);
    }
}
