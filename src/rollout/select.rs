//! Which nodes of a tree grow new branches in an expansion round.

use serde::{Deserialize, Serialize};

use crate::engine::SeqRng;

use super::forest::NodeId;

/// Node selection of Tree-GRPO's expansion step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Selection {
    /// N distinct non-leaf step nodes, the root excluded, as the paper describes; when
    /// a tree has fewer, all of them plus fresh chains from the root make up N.
    Paper,
    /// N draws with replacement over the root and the non-leaf step nodes, as the
    /// reference code does (drawing the root starts a fresh chain).
    Reference,
}

impl std::str::FromStr for Selection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "paper" => Ok(Selection::Paper),
            "reference" => Ok(Selection::Reference),
            other => Err(format!("unknown selection '{other}' (paper or reference)")),
        }
    }
}

/// Picks `n` nodes among `candidates` (inner step nodes, ascending ids); drawing
/// [`NodeId::ROOT`] starts a fresh chain.
pub fn select_nodes(
    selection: Selection,
    candidates: &[NodeId],
    n: usize,
    rng: &mut SeqRng,
) -> Vec<NodeId> {
    let below = |k: usize| (rng.next_u64() % k as u64) as usize;
    match selection {
        Selection::Paper => {
            let mut pool = candidates.to_vec();
            if pool.len() <= n {
                let fill = n - pool.len();
                pool.extend(std::iter::repeat_n(NodeId::ROOT, fill));
                return pool;
            }
            // Partial Fisher-Yates: the first n of a uniform shuffle.
            let mut below = below;
            for i in 0..n {
                let j = i + below(pool.len() - i);
                pool.swap(i, j);
            }
            pool.truncate(n);
            pool.sort_unstable();
            pool
        }
        Selection::Reference => {
            let mut all = vec![NodeId::ROOT];
            all.extend_from_slice(candidates);
            let mut below = below;
            let mut picks: Vec<NodeId> = (0..n).map(|_| all[below(all.len())]).collect();
            picks.sort_unstable();
            picks
        }
    }
}
