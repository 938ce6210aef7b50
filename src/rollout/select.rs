//! Which nodes of a tree grow new branches in an expansion round.

use serde::{Deserialize, Serialize};

use crate::engine::SeqRng;
use crate::random::Uniform;

use super::forest::{NodeId, Tree};

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
    /// Entropy-guided, as TreeRL and ARPO fork where the policy is least sure: the N
    /// step boundaries (the root and the non-leaf step nodes) whose following step was
    /// sampled with the most surprise — the highest mean −log p over the tokens of the
    /// steps already grown from them, an estimate of the next step's per-token entropy.
    /// A new branch re-samples that uncertain step. Ties go to the lower id; when
    /// fewer than N boundaries qualify, fresh chains from the root make up N.
    Entropy,
}

impl std::str::FromStr for Selection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "paper" => Ok(Selection::Paper),
            "reference" => Ok(Selection::Reference),
            "entropy" => Ok(Selection::Entropy),
            other => Err(format!(
                "unknown selection '{other}' (paper, reference or entropy)"
            )),
        }
    }
}

/// Picks the `n` nodes of `tree` that grow a branch each in an expansion round;
/// drawing [`NodeId::ROOT`] starts a fresh chain.
pub fn select_nodes(selection: Selection, tree: &Tree, n: usize, rng: &mut SeqRng) -> Vec<NodeId> {
    if selection == Selection::Entropy {
        return most_surprising(tree, n);
    }
    select_among(selection, &tree.inner_steps(), n, rng)
}

/// The `n` step boundaries whose following steps had the highest mean surprise (see
/// [`Selection::Entropy`]).
fn most_surprising(tree: &Tree, n: usize) -> Vec<NodeId> {
    // Per boundary: summed −log p and token count of its children's steps.
    let mut sums = vec![(0.0f64, 0usize); tree.nodes.len()];
    for node in &tree.nodes {
        if let Some(parent) = node.parent {
            let s = &mut sums[parent.index()];
            s.0 -= node.logprobs.iter().map(|&l| f64::from(l)).sum::<f64>();
            s.1 += node.logprobs.len();
        }
    }
    let mut scored: Vec<(f64, NodeId)> = std::iter::once(NodeId::ROOT)
        .chain(tree.inner_steps())
        .filter(|id| sums[id.index()].1 > 0)
        .map(|id| {
            let (sum, count) = sums[id.index()];
            (sum / count as f64, id)
        })
        .collect();
    // Highest surprise first; equal surprise: lower id first.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut picks: Vec<NodeId> = scored.into_iter().take(n).map(|(_, id)| id).collect();
    picks.resize(n, NodeId::ROOT);
    picks.sort_unstable();
    picks
}

/// Picks `n` nodes among `candidates` (inner step nodes, ascending ids) for the
/// random selections.
fn select_among(
    selection: Selection,
    candidates: &[NodeId],
    n: usize,
    rng: &mut SeqRng,
) -> Vec<NodeId> {
    match selection {
        Selection::Paper => {
            let mut pool = candidates.to_vec();
            if pool.len() <= n {
                let fill = n - pool.len();
                pool.extend(std::iter::repeat_n(NodeId::ROOT, fill));
                return pool;
            }
            // The first n of a uniform shuffle.
            rng.shuffle_first(&mut pool, n);
            pool.truncate(n);
            pool.sort_unstable();
            pool
        }
        Selection::Reference | Selection::Entropy => {
            let mut all = vec![NodeId::ROOT];
            all.extend_from_slice(candidates);
            let mut picks: Vec<NodeId> = (0..n).map(|_| all[rng.below(all.len())]).collect();
            picks.sort_unstable();
            picks
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::Node;

    /// A node whose step sampled tokens with these log-probabilities.
    fn step(logprobs: &[f32], terminal: bool) -> Node {
        let mut n = Node::root();
        n.depth = 1;
        n.tokens = vec![0; logprobs.len()];
        n.logprobs = logprobs.to_vec();
        n.terminal = terminal;
        n
    }

    #[test]
    fn entropy_picks_the_boundaries_before_the_most_surprising_steps() {
        // root → a (surprise 0.1) → b (surprise 2.0) → leaf c (surprise 0.5);
        //      → d (surprise 1.0, terminal).
        let mut t = Tree::new("p".into(), 0);
        let a = t.push_child(NodeId::ROOT, step(&[-0.1, -0.1], false));
        let b = t.push_child(a, step(&[-1.0, -3.0], false));
        t.push_child(b, step(&[-0.5], true));
        t.push_child(NodeId::ROOT, step(&[-1.0], true));
        let mut rng = SeqRng::from_parts(&[1]);
        // Boundaries: root (children a, d: (0.2 + 1.0) / 3 = 0.4), a (child b: 2.0),
        // b (child c: 0.5). Highest first: a, b, root.
        assert_eq!(select_nodes(Selection::Entropy, &t, 1, &mut rng), vec![a]);
        assert_eq!(
            select_nodes(Selection::Entropy, &t, 2, &mut rng),
            vec![a, b]
        );
        assert_eq!(
            select_nodes(Selection::Entropy, &t, 3, &mut rng),
            vec![NodeId::ROOT, a, b]
        );
        // More than there are: fresh chains make up the rest.
        assert_eq!(
            select_nodes(Selection::Entropy, &t, 4, &mut rng),
            vec![NodeId::ROOT, NodeId::ROOT, a, b]
        );
    }
}
