//! Trees of agent steps, as plain data: what the sampler grows and the export writes.
//!
//! Node 0 of every tree is the root (the prompt, no tokens). Every other node is one
//! whole agent step: the model's tokens (thought and action, loss mask 1) and the
//! observation the environment answered with (prompt tokens, loss mask 0). A node whose
//! episode ended is a leaf: a finished trajectory with a reward.
//!
//! A prompt's [`Forest`] is its trees, the branches that failed, and what it cost.

use std::fmt;
use std::ops::Index;

use serde::{Deserialize, Serialize};

use crate::env::{Action, Score};
use crate::model::TokenId;

use super::cost::ForestCost;

/// A node of a [`Tree`]: its index in the tree's `nodes` (the root is node 0). Written
/// as the bare number, so `forest.jsonl` and `trajectories.jsonl` read as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(usize);

impl NodeId {
    /// The root of every tree (the prompt).
    pub const ROOT: NodeId = NodeId(0);

    /// The node at `index` in its tree's `nodes`.
    pub fn new(index: usize) -> Self {
        NodeId(index)
    }

    /// Index into the tree's `nodes`.
    pub fn index(self) -> usize {
        self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One agent step (or the root).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The node's own id (its index in the tree's `nodes`).
    pub id: NodeId,
    /// The step it continues; `None` only for the root.
    pub parent: Option<NodeId>,
    /// Steps from the root: 0 for the root, 1 for a first step, and so on (a leaf's
    /// depth is its trajectory's number of turns).
    pub depth: usize,
    /// Generated tokens of this step and their logprobs.
    pub tokens: Vec<TokenId>,
    /// Natural-log probability of each of `tokens` under the policy at the run's
    /// temperature (same length as `tokens`, or empty where none was recorded).
    pub logprobs: Vec<f32>,
    /// Each token's log-probability under the distribution it was drawn from
    /// (truncation renormalised; a boosted token's at its branch sampling): what the
    /// update's importance weight divides by. Empty in older files (then: `logprobs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub behaviour_logprobs: Vec<f32>,
    /// How many of the step's first tokens were drawn from the branch sampling (a
    /// branch's first step only; 0 otherwise).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub boosted: usize,
    /// Observation tokens appended after this step (empty for a leaf).
    pub obs_tokens: Vec<TokenId>,
    /// The step's text as the model wrote it (empty for the root).
    pub text: String,
    /// The action the environment parsed from the step (`None` for the root).
    pub action: Option<Action>,
    /// The observation text the environment answered with (`None` for the root
    /// and for a step that ended the episode).
    pub observation: Option<String>,
    /// The episode ended with this step.
    pub terminal: bool,
    /// The trajectory's reward, on leaves.
    pub reward: Option<f64>,
    /// Why the leaf got its reward (answer, exact match, F1, format), on leaves.
    /// Older tree files have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<Score>,
    /// Mean reward of the leaves below (filled in after scoring).
    pub value: Option<f64>,
    /// The leaf's advantage (leaves) or the step's value advantage (inner nodes).
    pub advantage: Option<f64>,
}

impl Node {
    /// The root node: the prompt, with no tokens, depth 0 and no parent.
    pub fn root() -> Self {
        Node {
            id: NodeId::ROOT,
            parent: None,
            depth: 0,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            behaviour_logprobs: Vec::new(),
            boosted: 0,
            obs_tokens: Vec::new(),
            text: String::new(),
            action: None,
            observation: None,
            terminal: false,
            reward: None,
            score: None,
            value: None,
            advantage: None,
        }
    }
}

/// One tree of a prompt's forest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tree {
    /// The id of the sample (prompt) the tree answers.
    pub prompt_uid: String,
    /// The tree's index among its prompt's trees (`0..M`).
    pub tree_id: usize,
    /// The nodes, indexed by [`NodeId`]: the root first, every child after its
    /// parent.
    pub nodes: Vec<Node>,
}

impl Tree {
    /// A tree holding only its root.
    pub fn new(prompt_uid: String, tree_id: usize) -> Self {
        Tree {
            prompt_uid,
            tree_id,
            nodes: vec![Node::root()],
        }
    }

    /// The finished trajectories' last steps (nodes whose episode ended), in id order.
    pub fn leaves(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.terminal)
    }

    /// Step nodes whose episode goes on: where a branch may be grown.
    pub fn inner_steps(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|n| n.depth > 0 && !n.terminal)
            .map(|n| n.id)
            .collect()
    }

    /// Appends `node` as a child of `parent` and returns its id (its index).
    pub fn push_child(&mut self, parent: NodeId, mut node: Node) -> NodeId {
        let id = NodeId(self.nodes.len());
        node.id = id;
        node.parent = Some(parent);
        self.nodes.push(node);
        id
    }

    /// Node ids from the root to `id`, both included.
    pub fn path(&self, id: NodeId) -> Vec<NodeId> {
        let mut path = vec![id];
        let mut cur = id;
        while let Some(p) = self.nodes.get(cur.0).and_then(|n| n.parent) {
            path.push(p);
            cur = p;
        }
        path.reverse();
        path
    }
}

/// `tree[id]`: the node `id` names (panics, as slice indexing does, when the tree has
/// no such node).
impl Index<NodeId> for Tree {
    type Output = Node;

    fn index(&self, id: NodeId) -> &Node {
        &self.nodes[id.0]
    }
}

/// A branch that could not be grown because one of its sequences cannot fit the KV
/// pool or the context window. The steps it had grown reach no leaf, so they are left
/// out of the tree; the failure is recorded here (and in `summary.json`) instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedBranch {
    /// The tree it grew in; `None` when the prompt itself could not be computed.
    pub tree: Option<usize>,
    /// Its branch id within the tree (the seed's branch part).
    pub branch: u64,
    /// The node it started from.
    pub start_node: NodeId,
    /// Agent steps it had completed when it failed.
    pub steps_done: usize,
    /// The error that stopped it, as its message reads.
    pub error: String,
}

/// A finished forest: its trees, the branches that failed, and what it cost.
#[derive(Debug)]
pub struct Forest {
    /// The prompt's trees, in tree order (none when the prompt itself failed).
    pub trees: Vec<Tree>,
    /// Branches (or the prompt itself) that failed; empty when all went well.
    pub failed: Vec<FailedBranch>,
    /// Tokens computed, reused and appended, tool calls, skipped branches.
    pub cost: ForestCost,
    /// Wall-clock seconds the prompt's search took.
    pub wall_seconds: f64,
}

impl FailedBranch {
    /// The failure of a prompt itself (its episode could not start, or its prompt
    /// cannot fit the KV pool or the context window): no tree, no branch grown.
    pub fn prompt(error: String) -> Self {
        FailedBranch {
            tree: None,
            branch: 0,
            start_node: NodeId::ROOT,
            steps_done: 0,
            error,
        }
    }
}

impl Forest {
    /// A forest without trees: what it cost and the failures that left it empty.
    pub fn empty(cost: ForestCost, failed: Vec<FailedBranch>, wall_seconds: f64) -> Self {
        Forest {
            trees: Vec::new(),
            failed,
            cost,
            wall_seconds,
        }
    }

    /// The forest of a prompt that could not start (its environment failed to start
    /// the episode): no trees, the failure recorded.
    pub fn failed_prompt(error: String) -> Self {
        Forest::empty(
            ForestCost::default(),
            vec![FailedBranch::prompt(error)],
            0.0,
        )
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
