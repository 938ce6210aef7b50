//! How the branches of a step's trees differ: where they fork and how far apart
//! they end. Intra-tree credit is non-zero only where sibling leaves earn different
//! rewards; these figures say why they do or do not — branches that fork at the last
//! step before the answer, or that repeat their sibling's answer, carry little
//! step-level signal however many there are (the seed's pitfall: branches that differ
//! only trivially make trees noisy chains). Logged per step by the closed loop and
//! reported by `treegrpo compare`.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::export::TrajectoryRecord;
use super::forest::NodeId;
use crate::env::normalize::normalize_answer;
use crate::model::TokenId;

/// The branching of a set of trees' leaves (only trees with at least two leaves).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BranchingStats {
    /// Trees with at least two leaves.
    pub branched_trees: usize,
    /// Their leaves.
    pub leaves: usize,
    /// Nodes where the leaves' paths part (a node with two or more children on them).
    pub forks: usize,
    /// Mean agent steps before a fork (0: the branches part at the prompt).
    pub fork_depth_mean: f64,
    /// Mean agent steps of a leaf (its depth), to read the forks' depth against.
    pub leaf_depth_mean: f64,
    /// Mean agent steps a leaf has of its own: after the deepest fork on its path.
    pub own_steps_mean: f64,
    /// Mean share of a leaf's response tokens after the longest prefix it shares with
    /// a sibling leaf (1: nothing shared).
    pub own_token_share: f64,
    /// Share of sibling leaf pairs (same tree) that gave the same final answer,
    /// normalised as the task scores it (no answer counts as an answer of its own).
    pub answer_agreement: f64,
    /// Share of leaves whose whole response equals a sibling's, token for token.
    pub identical_leaf_share: f64,
}

/// The leaves of one tree, by index into the records.
fn trees(records: &[TrajectoryRecord]) -> Vec<Vec<usize>> {
    let mut order: Vec<(&str, usize)> = Vec::new();
    let mut by_tree: HashMap<(&str, usize), Vec<usize>> = HashMap::new();
    for (i, r) in records.iter().enumerate() {
        let key = (r.prompt_uid.as_str(), r.tree_id);
        by_tree
            .entry(key)
            .or_insert_with(|| {
                order.push(key);
                Vec::new()
            })
            .push(i);
    }
    order
        .into_iter()
        .filter_map(|k| by_tree.remove(&k))
        .collect()
}

fn common_prefix(a: &[TokenId], b: &[TokenId]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn answer(r: &TrajectoryRecord) -> Option<String> {
    r.trajectory
        .score
        .as_ref()
        .and_then(|s| s.details.answer.as_deref())
        .map(normalize_answer)
}

fn mean(sum: f64, n: usize) -> f64 {
    sum / n.max(1) as f64
}

impl BranchingStats {
    /// The branching of `records`' trees; `None` when no tree has two leaves (chains).
    pub fn of_records(records: &[TrajectoryRecord]) -> Option<Self> {
        let (mut branched, mut leaves, mut forks) = (0usize, 0usize, 0usize);
        let (mut fork_depth, mut leaf_depth, mut own_steps, mut own_tokens) = (0.0, 0.0, 0.0, 0.0);
        let (mut pairs, mut agreeing, mut identical) = (0usize, 0usize, 0usize);
        for tree in trees(records).into_iter().filter(|t| t.len() > 1) {
            branched += 1;
            leaves += tree.len();
            // The children each node has on the leaves' paths.
            let mut children: HashMap<NodeId, HashSet<NodeId>> = HashMap::new();
            for &i in &tree {
                for pair in records[i].node_path.windows(2) {
                    children.entry(pair[0]).or_default().insert(pair[1]);
                }
            }
            let is_fork = |n: &NodeId| children.get(n).is_some_and(|c| c.len() > 1);
            let mut seen_forks: HashSet<NodeId> = HashSet::new();
            for &i in &tree {
                let path = &records[i].node_path;
                let depth = path.len().saturating_sub(1);
                leaf_depth += depth as f64;
                let deepest = path[..depth].iter().rposition(is_fork).unwrap_or(0);
                own_steps += (depth - deepest) as f64;
                for (d, n) in path[..depth].iter().enumerate() {
                    if is_fork(n) && seen_forks.insert(*n) {
                        forks += 1;
                        fork_depth += d as f64;
                    }
                }
                let mine = &records[i].trajectory.response_ids;
                let shared = tree
                    .iter()
                    .filter(|&&j| j != i)
                    .map(|&j| common_prefix(mine, &records[j].trajectory.response_ids))
                    .max()
                    .unwrap_or(0);
                own_tokens += 1.0 - shared as f64 / mine.len().max(1) as f64;
                identical += usize::from(
                    tree.iter()
                        .any(|&j| j != i && records[j].trajectory.response_ids == *mine),
                );
            }
            for (a, &i) in tree.iter().enumerate() {
                for &j in &tree[a + 1..] {
                    pairs += 1;
                    agreeing += usize::from(answer(&records[i]) == answer(&records[j]));
                }
            }
        }
        (branched > 0).then(|| BranchingStats {
            branched_trees: branched,
            leaves,
            forks,
            fork_depth_mean: mean(fork_depth, forks),
            leaf_depth_mean: mean(leaf_depth, leaves),
            own_steps_mean: mean(own_steps, leaves),
            own_token_share: mean(own_tokens, leaves),
            answer_agreement: mean(agreeing as f64, pairs),
            identical_leaf_share: mean(identical as f64, leaves),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{RewardMetric, Score, ScoreDetails};
    use crate::rollout::Trajectory;

    fn leaf(
        prompt: &str,
        tree: usize,
        path: &[usize],
        tokens: &[TokenId],
        answer: Option<&str>,
    ) -> TrajectoryRecord {
        let mut trajectory = Trajectory::new(vec![7]);
        trajectory.response_ids = tokens.to_vec();
        trajectory.num_turns = path.len() - 1;
        trajectory.score = Some(Score {
            reward: 0.0,
            details: ScoreDetails {
                answer: answer.map(str::to_string),
                exact_match: false,
                f1: 0.0,
                metric: RewardMetric::ExactMatch,
                well_formed: true,
                format_issue: None,
                steps: path.len() - 1,
                tool_calls: 0,
                tool_errors: 0,
                invalid_actions: 0,
            },
        });
        TrajectoryRecord {
            prompt_uid: prompt.to_string(),
            tree_id: tree,
            leaf_id: NodeId::new(*path.last().unwrap()),
            node_path: path.iter().map(|&n| NodeId::new(n)).collect(),
            trajectory,
            advantage: 0.0,
            temperature: None,
        }
    }

    #[test]
    fn chains_have_no_branching() {
        let chains = [
            leaf("p", 0, &[0, 1, 2], &[1, 2], Some("a")),
            leaf("p", 1, &[0, 1, 2], &[1, 3], Some("b")),
        ];
        assert_eq!(BranchingStats::of_records(&chains), None);
    }

    #[test]
    fn forks_shares_and_agreement_by_hand() {
        let records = [
            // Prompt p, tree 0: 1 forks to 2 and 4 (after 1 step), 2 to 3 and 6 (2).
            leaf("p", 0, &[0, 1, 2, 3], &[1, 2, 3, 4], Some("Paris")),
            leaf("p", 0, &[0, 1, 4, 5], &[1, 2, 9, 9], Some("paris.")),
            leaf("p", 0, &[0, 1, 2, 6], &[1, 2, 3, 7], None),
            // A chain beside it: not counted.
            leaf("p", 1, &[0, 1, 2], &[1, 2, 3, 4], Some("Paris")),
            // Prompt q, tree 0: two identical leaves forked at the prompt.
            leaf("q", 0, &[0, 1], &[5, 5], None),
            leaf("q", 0, &[0, 2], &[5, 5], None),
        ];
        let s = BranchingStats::of_records(&records).unwrap();
        assert_eq!((s.branched_trees, s.leaves, s.forks), (2, 5, 3));
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // Forks after 1, 2 and 0 steps.
        assert!(close(s.fork_depth_mean, 1.0), "{s:?}");
        assert!(close(s.leaf_depth_mean, 11.0 / 5.0), "{s:?}");
        // Own steps after the deepest fork: 1, 2, 1 and 1, 1.
        assert!(close(s.own_steps_mean, 6.0 / 5.0), "{s:?}");
        // Own tokens: 1 − 3/4, 1 − 2/4, 1 − 3/4, then 0 and 0 (identical).
        assert!(close(s.own_token_share, 1.0 / 5.0), "{s:?}");
        // Pairs: Paris = paris. (normalised), neither = no answer; q's two agree.
        assert!(close(s.answer_agreement, 2.0 / 4.0), "{s:?}");
        assert!(close(s.identical_leaf_share, 2.0 / 5.0), "{s:?}");
    }
}
