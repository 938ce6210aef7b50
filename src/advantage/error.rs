//! The one error type of the advantage layer: bad input, or a lookup that does
//! not match the forest it is made in.

use super::node_idx::NodeIdx;

/// Everything that can be wrong with the input, or with a lookup into it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdvantageError {
    /// [`PromptForest::new`](super::PromptForest::new) was given no trees: a prompt
    /// group needs at least one tree to normalise over.
    #[error("prompt group has no trees")]
    EmptyPromptGroup,
    /// A tree with no nodes (a rollout that produced nothing).
    #[error("tree {tree} has no nodes")]
    EmptyTree {
        /// The tree's index in the prompt group (the order the trees were given in).
        tree: usize,
    },
    /// A node's parent index points past the end of its tree's `nodes`.
    #[error("tree {tree}: node {node} has parent {parent}, but the tree has {len} nodes")]
    ParentOutOfRange {
        /// The tree's index in the prompt group (the order the trees were given in).
        tree: usize,
        /// The node whose parent is bad.
        node: NodeIdx,
        /// The parent index it names.
        parent: NodeIdx,
        /// The tree's node count: valid indices are `0..len`.
        len: usize,
    },
    /// Parent links that loop, so a node never reaches a root.
    #[error("tree {tree}: node {node} is not reachable from a root (parent links form a cycle)")]
    Cycle {
        /// The tree's index in the prompt group (the order the trees were given in).
        tree: usize,
        /// The lowest-index node that no walk down from a root reaches.
        node: NodeIdx,
    },
    /// A leaf (a finished trajectory) without a reward: every leaf must be scored
    /// before advantages can be computed.
    #[error("tree {tree}: leaf {node} has no reward")]
    MissingReward {
        /// The tree's index in the prompt group (the order the trees were given in).
        tree: usize,
        /// The unscored leaf.
        node: NodeIdx,
    },
    /// A leaf whose reward is NaN or infinite (a reward function's bug); it would
    /// poison every mean and standard deviation of the group.
    #[error("tree {tree}: leaf {node} has non-finite reward {reward}")]
    NonFiniteReward {
        /// The tree's index in the prompt group (the order the trees were given in).
        tree: usize,
        /// The leaf.
        node: NodeIdx,
        /// Its reward.
        reward: f64,
    },
    /// A lookup named a tree the forest does not have.
    #[error("tree {tree} out of range: the prompt has {trees} trees")]
    TreeOutOfRange {
        /// The tree index asked for.
        tree: usize,
        /// The trees in the forest: valid indices are `0..trees`.
        trees: usize,
    },
    /// A lookup named a node its tree does not have.
    #[error("tree {tree}: node {node} out of range: the tree has {len} nodes")]
    NodeOutOfRange {
        /// The tree's index in the prompt group (the order the trees were given in).
        tree: usize,
        /// The node index asked for.
        node: NodeIdx,
        /// The tree's node count: valid indices are `0..len`.
        len: usize,
    },
    /// Token advantages were asked for a node that is not a leaf (it has no reward);
    /// only finished trajectories have them.
    #[error("tree {tree}: node {node} is not a leaf")]
    NotALeaf {
        /// The tree's index in the prompt group (the order the trees were given in).
        tree: usize,
        /// The node asked for.
        node: NodeIdx,
    },
    /// The leaf advantages have no entry for a leaf of this forest: they were computed
    /// from a different forest. Compute them from the same [`PromptForest`](super::PromptForest).
    #[error("tree {tree}: no advantage for leaf {node} (advantages from another forest?)")]
    MissingAdvantage {
        /// The tree's index in the prompt group (the order the trees were given in).
        tree: usize,
        /// The leaf without an advantage.
        node: NodeIdx,
    },
    /// An advantage mode name that is not one of `tree`, `tree-2norm`, `inter`,
    /// `intra` or `grpo` (from a command line or config file).
    #[error("unknown advantage mode {given:?} (expected tree, tree-2norm, inter, intra or grpo)")]
    UnknownMode {
        /// The name as given.
        given: String,
    },
}
