//! Advantages for Tree-GRPO (arXiv 2509.21240): pure math over finished forests.
//!
//! One prompt owns a group of M trees. Every tree's leaves are finished agent
//! trajectories carrying a scalar reward; internal nodes are agent steps shared
//! by all the leaves below them. This module turns those rewards into training
//! signals and does nothing else: no I/O, no tensors, no sampling.
//!
//! Flow:
//! 1. Describe the rollouts with [`TreeView`] / [`NodeView`] and validate them
//!    into a [`PromptForest`] (`PromptForest::new`), which rejects leaves without a
//!    reward, bad parent links, cycles and empty groups ([`AdvantageError`]).
//! 2. [`leaf_advantages`] gives one advantage per leaf for an [`AdvantageMode`].
//! 3. [`token_advantages`] spreads a leaf's advantage over the tokens of its
//!    root-to-leaf path (zero on observation tokens).
//! 4. [`step_values`] gives per-node values (mean reward of the leaves below)
//!    and step advantages (value minus the parent's value).
//! 5. [`packed_weights`] gives, per unique node, the sum of the advantages of the
//!    leaves below it: the weight its tokens get when every root-to-leaf
//!    trajectory is trained on and shared prefixes are computed once.
//!
//! Trees cut to K leaves: if the rollout kept only K leaves per tree, pass the cut
//! tree. The math only ever sees the leaves it is given, so an internal node whose
//! sibling subtree was pruned simply has fewer leaves below it. A cut must also
//! drop internal nodes left with no leaf at all, otherwise they become leaves
//! without a reward and validation fails.

mod error;
mod forest_view;
mod leaf;
mod node_idx;
mod packed;
mod signal;
mod stats;
mod step_values;
mod token;

pub use error::AdvantageError;
pub use forest_view::{CheckedTree, NodeView, PromptForest, TreeView};
pub use leaf::{group_advantages, leaf_advantages, AdvantageMode, LeafAdvantage, LeafAdvantages};
pub use node_idx::NodeIdx;
pub use packed::{packed_weights, PackedWeights};
pub use signal::{AdvantageSignal, RewardGroup};
pub use stats::{group_normalize, STD_EPS};
pub use step_values::{step_values, StepValue, StepValues};
pub use token::{token_advantages, token_advantages_for_path};
