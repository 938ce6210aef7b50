//! Step-level values and advantages implied by a tree's leaf rewards.
//!
//! A node's value is the mean reward of the leaves below it: the Monte-Carlo
//! estimate of how good it is to have reached that step. A step's advantage is
//! how much it changed that estimate, i.e. its value minus its parent's value.

use super::forest_view::PromptForest;
use super::node_idx::NodeIdx;
use super::stats::mean;
use serde::Serialize;

/// Value and advantage of one node (one agent step).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepValue {
    /// The step's node in its tree.
    pub node: NodeIdx,
    /// Number of leaves below this node (1 for a leaf).
    pub leaves: usize,
    /// Mean reward of those leaves (a leaf's value is its own reward).
    pub value: f64,
    /// `value − parent's value`; for a root, `value − prompt_mean`, so a root
    /// is credited for beating the prompt's other trees.
    pub advantage: f64,
}

/// Step values of every node of every tree of one prompt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepValues {
    /// Plain mean reward over all the prompt's leaves: the roots' baseline.
    pub prompt_mean: f64,
    /// `trees[t][n]` is node `n` of tree `t`.
    pub trees: Vec<Vec<StepValue>>,
}

/// Values and step advantages for every node of the prompt group.
pub fn step_values(forest: &PromptForest) -> StepValues {
    let rewards: Vec<f64> = forest
        .trees()
        .iter()
        .flat_map(|t| t.leaves().iter().map(|&l| t.reward(l).unwrap_or(0.0)))
        .collect();
    let prompt_mean = mean(&rewards);
    let trees = forest
        .trees()
        .iter()
        .map(|t| {
            let sums = t.sum_below(|leaf| t.reward(leaf).unwrap_or(0.0));
            let counts: Vec<usize> = (0..t.num_nodes())
                .map(|i| t.leaves_below(NodeIdx(i)).unwrap_or(1))
                .collect();
            // Every node has at least one leaf below it (itself if it is a leaf).
            let values: Vec<f64> = sums
                .iter()
                .zip(&counts)
                .map(|(s, &c)| s / c as f64)
                .collect();
            (0..t.num_nodes())
                .map(|i| {
                    let node = NodeIdx(i);
                    let baseline = t.parent(node).map_or(prompt_mean, |p| values[p.0]);
                    StepValue {
                        node,
                        leaves: counts[i],
                        value: values[i],
                        advantage: values[i] - baseline,
                    }
                })
                .collect()
        })
        .collect();
    StepValues { prompt_mean, trees }
}
