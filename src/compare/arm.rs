//! An arm of the comparison: how its rollouts are shaped and how their advantages are
//! computed — Tree-GRPO's ablation table as names.
//!
//! - `tree`: (2, 2, 1) trees, intra- plus inter-tree advantages (the paper's method).
//! - `tree-inter`, `tree-intra`, `tree-2norm`: the same trees, one advantage ablated.
//! - `tree-M-N-L` (and `tree-inter-M-N-L`, …): another shape, e.g. `tree-2-4-1` or
//!   two rounds, `tree-2-2-2`.
//! - `chain`, `chain-G`: GRPO over independent chains (4 by default), the baseline.
//! - A trailing `-entropy` (`tree-entropy`, `tree-2-4-1-entropy`) expands the step
//!   boundaries whose next step was most uncertain instead of random ones
//!   ([`Selection::Entropy`]).
//! - A trailing `-b<spec>` draws each branch's first tokens from a wider distribution
//!   ([`BranchSampling`]: `tree-bt2`, `tree-bt1.5p0.95s`); `-treerl` is TreeRL's
//!   preset (`tree-treerl` = `tree-bt5k16q0.5`). A further `-mask` leaves the boosted
//!   tokens out of the loss instead of importance-weighting them
//!   ([`BoostedTokens::Masked`]). The suffixes come last, in any order.
//!
//! Under the step budget the number of trees (chains) per prompt is the budget's: the
//! first wave grows one on every prompt and later waves add more until the budget is
//! spent, so M (and G) name the shape but do not fix the count; N and L do.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::ArmError;
use crate::advantage::AdvantageMode;
use crate::closed_loop::BoostedTokens;
use crate::rollout::{BranchSampling, Selection, TreeShape};

/// The default tree shape (M, N, L).
const TREE: (usize, usize, usize) = (2, 2, 1);
/// Chains per prompt in the chain arm's first wave.
const CHAINS: usize = 4;

/// One arm (see the module doc); it reads and prints as its name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Arm {
    name: String,
    /// The shape of the first wave.
    pub shape: TreeShape,
    /// The advantage mode.
    pub advantage: AdvantageMode,
    /// How branches' first tokens are drawn (`None`: as every other token).
    pub branch_sampling: Option<BranchSampling>,
    /// What the update does with the boosted tokens.
    pub boosted_tokens: BoostedTokens,
}

impl Arm {
    /// The arm's name: its key in `summary.json` and its folder under `runs/`.
    pub fn name(&self) -> &str {
        &self.name
    }
}

fn numbers(name: &str, parts: &[&str]) -> Result<Vec<usize>, ArmError> {
    parts
        .iter()
        .map(|p| match p.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(ArmError::Shape(name.to_string())),
        })
        .collect()
}

impl FromStr for Arm {
    type Err = ArmError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts: Vec<&str> = s.split('-').collect();
        // The branch sampling suffixes, last and in any order.
        let (mut branch_sampling, mut boosted_tokens) = (None, BoostedTokens::Corrected);
        let mut suffixed = false;
        while parts.len() > 1 {
            let last = parts[parts.len() - 1];
            if last == "mask" {
                boosted_tokens = BoostedTokens::Masked;
            } else if last == "treerl" {
                branch_sampling = Some(BranchSampling::treerl());
            } else if let Some(spec) = last.strip_prefix('b') {
                let b = spec.parse().map_err(|source| ArmError::BranchSampling {
                    arm: s.to_string(),
                    source,
                })?;
                branch_sampling = Some(b);
            } else {
                break;
            }
            suffixed = true;
            parts.pop();
        }
        if parts[0] == "chain" && suffixed {
            return Err(ArmError::ChainBranches(s.to_string()));
        }
        if boosted_tokens == BoostedTokens::Masked && branch_sampling.is_none() {
            return Err(ArmError::Shape(s.to_string()));
        }
        let (shape, advantage) = match parts.as_slice() {
            ["chain", rest @ ..] => {
                let g = match numbers(s, rest)?.as_slice() {
                    [] => CHAINS,
                    [g] => *g,
                    _ => return Err(ArmError::Shape(s.to_string())),
                };
                (TreeShape::chains(g), AdvantageMode::Grpo)
            }
            ["tree", rest @ ..] => {
                let (selection, rest) = match rest.split_last() {
                    Some((&"entropy", rest)) => (Selection::Entropy, rest),
                    _ => (Selection::Paper, rest),
                };
                let (advantage, dims) = match rest.first().map(|m| m.parse::<AdvantageMode>()) {
                    Some(Ok(m)) if m != AdvantageMode::Grpo => (m, &rest[1..]),
                    _ => (AdvantageMode::Tree, rest),
                };
                let (m, n, l) = match numbers(s, dims)?.as_slice() {
                    [] => TREE,
                    [m, n, l] => (*m, *n, *l),
                    _ => return Err(ArmError::Shape(s.to_string())),
                };
                (TreeShape::tree(m, n, l, selection), advantage)
            }
            _ => return Err(ArmError::Unknown(s.to_string())),
        };
        Ok(Arm {
            name: s.to_string(),
            shape,
            advantage,
            branch_sampling,
            boosted_tokens,
        })
    }
}

impl TryFrom<String> for Arm {
    type Error = ArmError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Arm> for String {
    fn from(a: Arm) -> String {
        a.name
    }
}

impl fmt::Display for Arm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Arms from a comma-separated list, each once.
pub fn parse_arms(list: &str) -> Result<Vec<Arm>, ArmError> {
    let mut arms: Vec<Arm> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let arm: Arm = name.parse()?;
        if arms.iter().any(|a| a.name == arm.name) {
            return Err(ArmError::Twice(arm.name));
        }
        arms.push(arm);
    }
    Ok(arms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_as_the_ablation_table() {
        let a: Arm = "tree".parse().unwrap();
        assert_eq!(
            (a.shape, a.advantage),
            (
                TreeShape::tree(2, 2, 1, Selection::Paper),
                AdvantageMode::Tree
            )
        );
        let a: Arm = "tree-intra".parse().unwrap();
        assert_eq!(a.advantage, AdvantageMode::Intra);
        let a: Arm = "tree-inter-2-4-1".parse().unwrap();
        assert_eq!((a.shape.expand, a.advantage), (4, AdvantageMode::Inter));
        let a: Arm = "tree-intra-2-4-1-entropy".parse().unwrap();
        assert_eq!(
            (a.shape.expand, a.shape.selection, a.advantage),
            (4, Selection::Entropy, AdvantageMode::Intra)
        );
        let a: Arm = "tree-2-2-2".parse().unwrap();
        assert_eq!(a.shape.rounds, 2);
        let a: Arm = "chain".parse().unwrap();
        assert_eq!(
            (a.shape.trees, a.shape.is_chains(), a.advantage),
            (4, true, AdvantageMode::Grpo)
        );
        assert_eq!("chain-6".parse::<Arm>().unwrap().shape.trees, 6);
        assert!(matches!("bush".parse::<Arm>(), Err(ArmError::Unknown(_))));
        assert!(matches!(
            "tree-2-0-1".parse::<Arm>(),
            Err(ArmError::Shape(_))
        ));
        assert!(matches!("tree-2-2".parse::<Arm>(), Err(ArmError::Shape(_))));
        assert!(matches!(
            "tree-grpo".parse::<Arm>(),
            Err(ArmError::Shape(_))
        ));
        assert_eq!(parse_arms("tree, chain").unwrap().len(), 2);
        assert!(matches!(parse_arms("tree,tree"), Err(ArmError::Twice(_))));
    }

    #[test]
    fn branch_sampling_suffixes_come_last_in_any_order() {
        let a: Arm = "tree-inter-treerl".parse().unwrap();
        assert_eq!(
            (a.advantage, a.branch_sampling, a.boosted_tokens),
            (
                AdvantageMode::Inter,
                Some(BranchSampling::treerl()),
                BoostedTokens::Corrected
            )
        );
        let a: Arm = "tree-2-4-1-entropy-bt1.5p0.95s-mask".parse().unwrap();
        assert_eq!(
            (a.shape.expand, a.shape.selection, a.boosted_tokens),
            (4, Selection::Entropy, BoostedTokens::Masked)
        );
        assert_eq!(a.branch_sampling.unwrap().to_string(), "t1.5p0.95s");
        let b: Arm = "tree-mask-bt2".parse().unwrap();
        assert_eq!(b.branch_sampling.unwrap().to_string(), "t2");
        assert_eq!("tree".parse::<Arm>().unwrap().branch_sampling, None);
        assert!(matches!(
            "chain-treerl".parse::<Arm>(),
            Err(ArmError::ChainBranches(_))
        ));
        assert!(matches!(
            "tree-bx2".parse::<Arm>(),
            Err(ArmError::BranchSampling { .. })
        ));
        // Masking needs something boosted to mask.
        assert!(matches!(
            "tree-mask".parse::<Arm>(),
            Err(ArmError::Shape(_))
        ));
    }
}
