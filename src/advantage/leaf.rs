//! Per-leaf (per-trajectory) advantages for each Tree-GRPO mode.
//!
//! Two groups give a leaf its baseline: its own tree (intra-tree: siblings that
//! share a prefix, so the difference isolates what happened after the split) and
//! the whole prompt (inter-tree: every trajectory for the same task, as in GRPO).
//! Each mode combines [`group_normalize`] over those groups differently.

use super::error::AdvantageError;
use super::forest_view::PromptForest;
use super::node_idx::NodeIdx;
use super::stats::group_normalize;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// How a leaf's reward becomes its advantage. `norm_G(r)` below is
/// `(r − mean_G)/(std_G + 1e-6)` over group `G` (unbiased std; a group of one
/// has mean 0 and std 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum AdvantageMode {
    /// `norm_tree(r) + norm_prompt(r)`: the paper's default.
    #[default]
    #[serde(rename = "tree")]
    Tree,
    /// `norm_tree(norm_prompt(r))`: normalise over the prompt, then renormalise
    /// those values over the tree.
    #[serde(rename = "tree-2norm")]
    Tree2Norm,
    /// `norm_prompt(r)` only.
    #[serde(rename = "inter")]
    Inter,
    /// `norm_tree(r)` only.
    #[serde(rename = "intra")]
    Intra,
    /// Chain baseline: `norm_prompt(r)` over the prompt's G chains. Same numbers
    /// as `inter`; the separate name records that the rollouts are independent
    /// chains (one-leaf trees, or one tree of parentless leaves).
    #[serde(rename = "grpo")]
    Grpo,
}

impl AdvantageMode {
    /// Every mode, in declaration order: what `FromStr` accepts, by [`Self::name`].
    pub const ALL: [Self; 5] = [
        Self::Tree,
        Self::Tree2Norm,
        Self::Inter,
        Self::Intra,
        Self::Grpo,
    ];

    /// The name used by serde, `FromStr` and `Display`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tree => "tree",
            Self::Tree2Norm => "tree-2norm",
            Self::Inter => "inter",
            Self::Intra => "intra",
            Self::Grpo => "grpo",
        }
    }
}

impl fmt::Display for AdvantageMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AdvantageMode {
    type Err = AdvantageError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| AdvantageError::UnknownMode {
                given: s.to_string(),
            })
    }
}

/// The advantage of one finished trajectory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeafAdvantage {
    /// Index of the leaf's tree in its prompt group.
    pub tree: usize,
    /// The leaf's node within that tree.
    pub node: NodeIdx,
    /// The trajectory's outcome reward.
    pub reward: f64,
    /// Its advantage under the group's [`AdvantageMode`]: the weight of its model
    /// tokens in the policy loss.
    pub advantage: f64,
}

/// Advantages of all leaves of one prompt, ordered by tree, then by node index
/// (the order of `PromptForest::trees()` and `CheckedTree::leaves()`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeafAdvantages {
    /// The mode the advantages were computed under.
    pub mode: AdvantageMode,
    /// One entry per leaf, tree by tree, leaves in ascending node index.
    pub leaves: Vec<LeafAdvantage>,
}

impl LeafAdvantages {
    /// Advantage of leaf `node` of tree `tree`, if there is one.
    pub fn get(&self, tree: usize, node: NodeIdx) -> Option<f64> {
        // Sorted by (tree, node) by construction.
        self.leaves
            .binary_search_by_key(&(tree, node), |l| (l.tree, l.node))
            .ok()
            .map(|i| self.leaves[i].advantage)
    }

    /// Just the advantages, in leaf order.
    pub fn values(&self) -> Vec<f64> {
        self.leaves.iter().map(|l| l.advantage).collect()
    }
}

/// One advantage per leaf of the prompt group, for `mode`.
pub fn leaf_advantages(forest: &PromptForest, mode: AdvantageMode) -> LeafAdvantages {
    let mut ids = Vec::with_capacity(forest.num_leaves());
    let mut rewards = Vec::with_capacity(forest.num_leaves());
    // Where each tree's leaves sit in the flat `rewards` vector.
    let mut ranges: Vec<Range<usize>> = Vec::with_capacity(forest.trees().len());
    for tree in forest.trees() {
        let start = rewards.len();
        for &node in tree.leaves() {
            ids.push((tree.index(), node));
            // Validation guarantees every leaf has a finite reward.
            rewards.push(tree.reward(node).unwrap_or(0.0));
        }
        ranges.push(start..rewards.len());
    }
    let advantages = group_advantages(&rewards, &ranges, mode);
    let leaves = ids
        .into_iter()
        .zip(rewards.iter().zip(advantages))
        .map(|((tree, node), (&reward, advantage))| LeafAdvantage {
            tree,
            node,
            reward,
            advantage,
        })
        .collect();
    LeafAdvantages { mode, leaves }
}

/// The advantages of one prompt's leaves under `mode`, from their rewards alone:
/// `rewards` holds every leaf of the prompt, tree by tree, and `trees` the range of
/// each tree's leaves in it. What [`leaf_advantages`] computes for a checked forest,
/// and what a caller that assembles a prompt's trees from several rollouts (the
/// closed loop's budgeted steps) computes over the whole group.
pub fn group_advantages(rewards: &[f64], trees: &[Range<usize>], mode: AdvantageMode) -> Vec<f64> {
    let per_tree = |values: &[f64]| -> Vec<f64> {
        trees
            .iter()
            .flat_map(|r| group_normalize(&values[r.clone()]))
            .collect()
    };
    match mode {
        AdvantageMode::Tree => {
            let (intra, inter) = (per_tree(rewards), group_normalize(rewards));
            intra.iter().zip(&inter).map(|(a, b)| a + b).collect()
        }
        AdvantageMode::Tree2Norm => per_tree(&group_normalize(rewards)),
        AdvantageMode::Inter | AdvantageMode::Grpo => group_normalize(rewards),
        AdvantageMode::Intra => per_tree(rewards),
    }
}
