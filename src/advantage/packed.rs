//! Tree-packed weights: each shared step trained once with the summed signal.
//!
//! Training on every root-to-leaf trajectory of a tree repeats the shared prefix
//! once per leaf below it. The loss is linear in the per-token advantage, so the
//! same gradient is obtained by visiting each unique node once with, as weight,
//! the sum of the advantages of the leaves below it.

use super::error::AdvantageError;
use super::forest_view::PromptForest;
use super::leaf::{AdvantageMode, LeafAdvantages};
use super::node_idx::NodeIdx;
use super::token::token_advantages_for_path;
use serde::Serialize;

/// Per-node packed weights of one prompt group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PackedWeights {
    /// The advantage mode the weights were summed from.
    pub mode: AdvantageMode,
    /// `trees[t][n]`: sum of the advantages of the leaves below node `n` of tree `t`.
    pub trees: Vec<Vec<f64>>,
}

impl PackedWeights {
    /// Per-token weights of one node: its packed weight on model tokens, 0 on
    /// observation tokens, aligned with the node's `loss_mask`.
    pub fn node_tokens(
        &self,
        forest: &PromptForest,
        tree: usize,
        node: NodeIdx,
    ) -> Result<Vec<f64>, AdvantageError> {
        let t = forest.tree(tree)?;
        let len = t.num_nodes();
        let weight = self
            .trees
            .get(tree)
            .and_then(|w| w.get(node.0))
            .copied()
            .ok_or(AdvantageError::NodeOutOfRange { tree, node, len })?;
        let mask = &t
            .view()
            .nodes
            .get(node.0)
            .ok_or(AdvantageError::NodeOutOfRange { tree, node, len })?
            .loss_mask;
        Ok(token_advantages_for_path(weight, &[mask]))
    }
}

/// Packed weights for every node, from the leaf advantages of the same forest.
pub fn packed_weights(
    forest: &PromptForest,
    advantages: &LeafAdvantages,
) -> Result<PackedWeights, AdvantageError> {
    let mut trees = Vec::with_capacity(forest.trees().len());
    for t in forest.trees() {
        // Look every leaf up first so that a mismatched forest is an error, not a 0.
        for &node in t.leaves() {
            if advantages.get(t.index(), node).is_none() {
                return Err(AdvantageError::MissingAdvantage {
                    tree: t.index(),
                    node,
                });
            }
        }
        trees.push(t.sum_below(|leaf| advantages.get(t.index(), leaf).unwrap_or(0.0)));
    }
    Ok(PackedWeights {
        mode: advantages.mode,
        trees,
    })
}
