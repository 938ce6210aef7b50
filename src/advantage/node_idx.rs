//! [`NodeIdx`]: which node of its tree a step is, shared by the forest's checked
//! views and the errors that name a node (a leaf file, so neither imports the other).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Index of a node inside its own tree's `nodes` vector.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct NodeIdx(pub usize);

impl fmt::Display for NodeIdx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
