//! How much learning signal a set of rollouts carries, measured the way the advantage
//! modes see it: a group whose rewards are all equal normalises to zero, so only
//! prompts (inter-tree credit) and trees (intra-tree credit) with mixed rewards move
//! the policy. The learning comparison logs these per step (`treegrpo compare`).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::stats::group_normalize;

/// Rewards closer than this count as equal (rewards are sums of a few 0–1 terms).
const EQUAL: f64 = 1e-9;

/// One prompt's leaves as the advantage modes group them: every leaf's reward, tree by
/// tree, and the range of each tree's leaves.
#[derive(Debug, Clone, Copy)]
pub struct RewardGroup<'a> {
    /// Every leaf of the prompt, tree by tree.
    pub rewards: &'a [f64],
    /// Where each tree's leaves sit in `rewards`.
    pub trees: &'a [Range<usize>],
}

/// The signal of a step's rollouts (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdvantageSignal {
    /// Prompts measured.
    pub prompts: usize,
    /// Share of prompts whose leaves' rewards are not all equal: those whose inter-tree
    /// (GRPO) advantages are not all zero.
    pub mixed_prompt_share: f64,
    /// Trees with at least two leaves (0 for chains, whose trees are single leaves).
    pub branched_trees: usize,
    /// Share of the branched trees whose leaves' rewards are not all equal: those whose
    /// intra-tree advantages are not all zero. `None` without branched trees.
    pub mixed_tree_share: Option<f64>,
    /// Mean |norm_tree(r)| over the leaves of branched trees (`None` without any).
    pub intra_abs_mean: Option<f64>,
    /// Mean |norm_prompt(r)| over every leaf.
    pub inter_abs_mean: f64,
}

fn mixed(rewards: &[f64]) -> bool {
    let (lo, hi) = rewards
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &r| {
            (lo.min(r), hi.max(r))
        });
    rewards.len() > 1 && hi - lo > EQUAL
}

fn mean_abs(values: &[f64]) -> f64 {
    values.iter().map(|v| v.abs()).sum::<f64>() / values.len().max(1) as f64
}

impl AdvantageSignal {
    /// The signal of `groups`, one per prompt.
    pub fn of_groups(groups: &[RewardGroup<'_>]) -> Self {
        let (mut mixed_prompts, mut branched, mut mixed_trees) = (0usize, 0usize, 0usize);
        let (mut intra, mut inter) = (Vec::new(), Vec::new());
        for g in groups {
            mixed_prompts += usize::from(mixed(g.rewards));
            inter.extend(group_normalize(g.rewards));
            for tree in g.trees.iter().filter(|t| t.len() > 1) {
                let rewards = &g.rewards[tree.clone()];
                branched += 1;
                mixed_trees += usize::from(mixed(rewards));
                intra.extend(group_normalize(rewards));
            }
        }
        AdvantageSignal {
            prompts: groups.len(),
            mixed_prompt_share: mixed_prompts as f64 / groups.len().max(1) as f64,
            branched_trees: branched,
            mixed_tree_share: (branched > 0).then(|| mixed_trees as f64 / branched as f64),
            intra_abs_mean: (!intra.is_empty()).then(|| mean_abs(&intra)),
            inter_abs_mean: mean_abs(&inter),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_signal() {
        // Prompt A: tree [1, 0] (mixed) and tree [0, 0] (not); prompt B: chains 1, 1.
        let a = [1.0, 0.0, 0.0, 0.0];
        let a_trees = [0..2, 2..4];
        let b = [1.0, 1.0];
        let b_trees = [0..1, 1..2];
        let s = AdvantageSignal::of_groups(&[
            RewardGroup {
                rewards: &a,
                trees: &a_trees,
            },
            RewardGroup {
                rewards: &b,
                trees: &b_trees,
            },
        ]);
        assert_eq!(s.prompts, 2);
        assert_eq!(s.mixed_prompt_share, 0.5);
        assert_eq!(s.branched_trees, 2);
        assert_eq!(s.mixed_tree_share, Some(0.5));
        // Tree [1, 0]: mean 0.5, std 1/√2 → ±0.7071 (less the epsilon); tree [0, 0]: 0.
        let intra = s.intra_abs_mean.unwrap();
        assert!((intra - 0.5f64.sqrt() / 2.0).abs() < 1e-5, "{intra}");
        // Prompt A: mean 0.25, std 0.5 → 1.5, 0.5, 0.5, 0.5; B: 0, 0. Mean |.| = 3/6.
        assert!(
            (s.inter_abs_mean - 0.5).abs() < 1e-5,
            "{}",
            s.inter_abs_mean
        );
    }

    #[test]
    fn chains_have_no_intra_signal() {
        let r = [1.0, 0.0, 1.0];
        let t = [0..1, 1..2, 2..3];
        let s = AdvantageSignal::of_groups(&[RewardGroup {
            rewards: &r,
            trees: &t,
        }]);
        assert_eq!(s.branched_trees, 0);
        assert_eq!(s.mixed_tree_share, None);
        assert_eq!(s.intra_abs_mean, None);
        assert_eq!(s.mixed_prompt_share, 1.0);
    }
}
