//! Input types (one prompt's forest of rollout trees) and their validation.
//!
//! [`TreeView`]/[`NodeView`] are plain data the rollout code fills in.
//! [`PromptForest::new`] checks them once and precomputes what every advantage
//! function needs (children, a parents-first order, the leaves, leaf counts), so
//! the math elsewhere never has to re-check indices.

use super::error::AdvantageError;
use super::node_idx::NodeIdx;
use serde::{Deserialize, Serialize};

/// One agent step of a rollout tree.
///
/// A node with no child is a leaf, i.e. a finished trajectory, and must carry a
/// reward. Rewards on internal nodes are ignored: in Tree-GRPO only outcomes are
/// rewarded and step values are derived from the leaves (see `step_values`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    /// Parent step; `None` for a root. Several parentless nodes in one tree
    /// behave as children of one virtual root (e.g. G chains sharing only the prompt).
    pub parent: Option<NodeIdx>,
    /// Outcome reward of the trajectory ending here (required on leaves).
    pub reward: Option<f64>,
    /// One entry per token this step appended: `true` for a model token (trained
    /// on), `false` for an observation/tool token (advantage 0). May be empty.
    #[serde(default)]
    pub loss_mask: Vec<bool>,
}

impl NodeView {
    /// A root step (no parent, no reward).
    pub fn root() -> Self {
        Self::default()
    }

    /// An internal step under `parent`.
    pub fn step(parent: usize) -> Self {
        Self {
            parent: Some(NodeIdx(parent)),
            ..Self::default()
        }
    }

    /// A finished trajectory's last step, with its reward.
    pub fn leaf(parent: Option<usize>, reward: f64) -> Self {
        Self {
            parent: parent.map(NodeIdx),
            reward: Some(reward),
            loss_mask: Vec::new(),
        }
    }

    /// Same node with the given per-token loss mask.
    pub fn with_loss_mask(mut self, loss_mask: Vec<bool>) -> Self {
        self.loss_mask = loss_mask;
        self
    }
}

/// One rollout tree, nodes in any order (parents need not come first).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TreeView {
    /// The tree's steps; a node's index here is its [`NodeIdx`].
    pub nodes: Vec<NodeView>,
}

/// A validated tree plus the structure derived from it.
#[derive(Debug, Clone)]
pub struct CheckedTree {
    index: usize,
    view: TreeView,
    children: Vec<Vec<NodeIdx>>,
    /// Every node once, each parent before its children (breadth-first from the roots).
    order: Vec<usize>,
    /// Leaves in ascending index order; the order of every per-leaf output.
    leaves: Vec<NodeIdx>,
    leaves_below: Vec<usize>,
}

/// One prompt's validated group of trees.
#[derive(Debug, Clone)]
pub struct PromptForest {
    trees: Vec<CheckedTree>,
}

impl PromptForest {
    /// Validates a prompt group: at least one tree, every tree non-empty, parent
    /// indices in range, no cycles, and a finite reward on every leaf.
    pub fn new(trees: Vec<TreeView>) -> Result<Self, AdvantageError> {
        if trees.is_empty() {
            return Err(AdvantageError::EmptyPromptGroup);
        }
        let trees = trees
            .into_iter()
            .enumerate()
            .map(|(index, view)| CheckedTree::new(index, view))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { trees })
    }

    /// The validated trees, in the order given.
    pub fn trees(&self) -> &[CheckedTree] {
        &self.trees
    }

    /// Tree number `tree`; [`AdvantageError::TreeOutOfRange`] past the last.
    pub fn tree(&self, tree: usize) -> Result<&CheckedTree, AdvantageError> {
        self.trees.get(tree).ok_or(AdvantageError::TreeOutOfRange {
            tree,
            trees: self.trees.len(),
        })
    }

    /// Number of leaves (trajectories) over all trees.
    pub fn num_leaves(&self) -> usize {
        self.trees.iter().map(|t| t.leaves.len()).sum()
    }
}

impl CheckedTree {
    fn new(index: usize, view: TreeView) -> Result<Self, AdvantageError> {
        let len = view.nodes.len();
        if len == 0 {
            return Err(AdvantageError::EmptyTree { tree: index });
        }
        let mut children = vec![Vec::new(); len];
        let mut roots = Vec::new();
        for (i, node) in view.nodes.iter().enumerate() {
            match node.parent {
                None => roots.push(i),
                Some(p) if p.0 < len => children[p.0].push(NodeIdx(i)),
                Some(parent) => {
                    let node = NodeIdx(i);
                    return Err(AdvantageError::ParentOutOfRange {
                        tree: index,
                        node,
                        parent,
                        len,
                    });
                }
            }
        }
        // Each node has at most one parent, so a node missed by a walk down from
        // the roots is exactly one whose chain of parents loops.
        let mut order = roots;
        let mut next = 0;
        while next < order.len() {
            order.extend(children[order[next]].iter().map(|c| c.0));
            next += 1;
        }
        if order.len() < len {
            let mut seen = vec![false; len];
            order.iter().for_each(|&i| seen[i] = true);
            let node = NodeIdx(seen.iter().position(|s| !s).unwrap_or(0));
            return Err(AdvantageError::Cycle { tree: index, node });
        }
        let leaves: Vec<NodeIdx> = (0..len)
            .filter(|&i| children[i].is_empty())
            .map(NodeIdx)
            .collect();
        for &node in &leaves {
            match view.nodes[node.0].reward {
                None => return Err(AdvantageError::MissingReward { tree: index, node }),
                Some(reward) if !reward.is_finite() => {
                    return Err(AdvantageError::NonFiniteReward {
                        tree: index,
                        node,
                        reward,
                    })
                }
                Some(_) => {}
            }
        }
        let mut tree = Self {
            index,
            view,
            children,
            order,
            leaves,
            leaves_below: Vec::new(),
        };
        tree.leaves_below = tree
            .sum_below(|_| 1.0)
            .iter()
            .map(|&c| c as usize)
            .collect();
        Ok(tree)
    }

    /// Position of this tree in its prompt group.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The validated input.
    pub fn view(&self) -> &TreeView {
        &self.view
    }

    /// Nodes in the tree (leaves and internal steps).
    pub fn num_nodes(&self) -> usize {
        self.view.nodes.len()
    }

    /// Leaves in ascending index order.
    pub fn leaves(&self) -> &[NodeIdx] {
        &self.leaves
    }

    /// Reward of a leaf (`None` if `node` is out of range or not a leaf).
    pub fn reward(&self, node: NodeIdx) -> Option<f64> {
        let is_leaf = self.children.get(node.0)?.is_empty();
        if is_leaf {
            self.view.nodes[node.0].reward
        } else {
            None
        }
    }

    /// Parent of `node` (`None` for a root or an index out of range).
    pub fn parent(&self, node: NodeIdx) -> Option<NodeIdx> {
        self.view.nodes.get(node.0)?.parent
    }

    /// Children of `node`, empty for a leaf (`None` if `node` is out of range).
    pub fn children(&self, node: NodeIdx) -> Option<&[NodeIdx]> {
        self.children.get(node.0).map(Vec::as_slice)
    }

    /// How many of the given leaves lie under `node` (1 for a leaf).
    pub fn leaves_below(&self, node: NodeIdx) -> Option<usize> {
        self.leaves_below.get(node.0).copied()
    }

    /// Nodes from the root down to `node`, both included.
    pub fn path_to(&self, node: NodeIdx) -> Result<Vec<NodeIdx>, AdvantageError> {
        let len = self.num_nodes();
        if node.0 >= len {
            return Err(AdvantageError::NodeOutOfRange {
                tree: self.index,
                node,
                len,
            });
        }
        let mut path = vec![node];
        // Validation ruled out cycles, so this walk ends at a root.
        while let Some(parent) = self.view.nodes[path[path.len() - 1].0].parent {
            path.push(parent);
        }
        path.reverse();
        Ok(path)
    }

    /// For every node, the sum of `leaf_value` over the leaves below it.
    /// Shared by leaf counts, step values and packed weights.
    pub(super) fn sum_below(&self, leaf_value: impl Fn(NodeIdx) -> f64) -> Vec<f64> {
        let mut acc = vec![0.0; self.num_nodes()];
        for &leaf in &self.leaves {
            acc[leaf.0] = leaf_value(leaf);
        }
        // Children come after parents in `order`, so walking it backwards
        // finishes every subtree before its total is added to the parent.
        for &i in self.order.iter().rev() {
            if let Some(p) = self.view.nodes[i].parent {
                acc[p.0] += acc[i];
            }
        }
        acc
    }
}
