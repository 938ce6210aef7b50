//! The one error type of the advantage layer: bad input, or a lookup that does
//! not match the forest it is made in.

use super::forest_view::NodeIdx;

/// Everything that can be wrong with the input, or with a lookup into it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdvantageError {
    #[error("prompt group has no trees")]
    EmptyPromptGroup,
    #[error("tree {tree} has no nodes")]
    EmptyTree { tree: usize },
    #[error("tree {tree}: node {node} has parent {parent}, but the tree has {len} nodes")]
    ParentOutOfRange {
        tree: usize,
        node: NodeIdx,
        parent: NodeIdx,
        len: usize,
    },
    #[error("tree {tree}: node {node} is not reachable from a root (parent links form a cycle)")]
    Cycle { tree: usize, node: NodeIdx },
    #[error("tree {tree}: leaf {node} has no reward")]
    MissingReward { tree: usize, node: NodeIdx },
    #[error("tree {tree}: leaf {node} has non-finite reward {reward}")]
    NonFiniteReward {
        tree: usize,
        node: NodeIdx,
        reward: f64,
    },
    #[error("tree {tree} out of range: the prompt has {trees} trees")]
    TreeOutOfRange { tree: usize, trees: usize },
    #[error("tree {tree}: node {node} out of range: the tree has {len} nodes")]
    NodeOutOfRange {
        tree: usize,
        node: NodeIdx,
        len: usize,
    },
    #[error("tree {tree}: node {node} is not a leaf")]
    NotALeaf { tree: usize, node: NodeIdx },
    #[error("tree {tree}: no advantage for leaf {node} (advantages from another forest?)")]
    MissingAdvantage { tree: usize, node: NodeIdx },
    #[error("unknown advantage mode {given:?} (expected tree, tree-2norm, inter, intra or grpo)")]
    UnknownMode { given: String },
}
