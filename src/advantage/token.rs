//! Per-token advantages: a leaf's advantage spread over its root-to-leaf path.
//!
//! Training on one trajectory means training on the tokens of every step from
//! the root down to its leaf. Model tokens get the leaf's advantage; observation
//! (tool/environment) tokens get 0 because the policy did not produce them.

use super::error::AdvantageError;
use super::forest_view::PromptForest;
use super::leaf::LeafAdvantages;
use super::node_idx::NodeIdx;

/// `advantage` on every `true` (model) token and 0 on every `false`
/// (observation) token, over the concatenation of `masks` in order.
pub fn token_advantages_for_path(advantage: f64, masks: &[&[bool]]) -> Vec<f64> {
    masks
        .iter()
        .flat_map(|mask| {
            mask.iter()
                .map(|&model| if model { advantage } else { 0.0 })
        })
        .collect()
}

/// Per-token advantages of the trajectory ending at `leaf` of tree `tree`,
/// aligned with the concatenated tokens (`loss_mask`s) of its root-to-leaf path.
pub fn token_advantages(
    forest: &PromptForest,
    advantages: &LeafAdvantages,
    tree: usize,
    leaf: NodeIdx,
) -> Result<Vec<f64>, AdvantageError> {
    let t = forest.tree(tree)?;
    let path = t.path_to(leaf)?;
    if t.reward(leaf).is_none() {
        return Err(AdvantageError::NotALeaf { tree, node: leaf });
    }
    let advantage = advantages
        .get(tree, leaf)
        .ok_or(AdvantageError::MissingAdvantage { tree, node: leaf })?;
    let masks: Vec<&[bool]> = path
        .iter()
        .map(|n| t.view().nodes[n.0].loss_mask.as_slice())
        .collect();
    Ok(token_advantages_for_path(advantage, &masks))
}
