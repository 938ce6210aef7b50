//! How the branches of a step's trees differ: where they fork and how far apart
//! they end. Intra-tree credit is non-zero only where sibling leaves earn different
//! rewards; these figures say why they do or do not — branches that fork at the last
//! step before the answer, or that repeat their sibling's answer, carry little
//! step-level signal however many there are (the seed's pitfall: branches that differ
//! only trivially make trees noisy chains). Logged per step by the closed loop and
//! reported by `treegrpo compare`.
//!
//! Tokens say whether siblings were written differently; the trees' nodes say whether
//! they *did* anything different — called other tools or asked other queries, and so
//! saw other observations (the method's own check: branches should meet different
//! observations, else the search explores nothing). Those two shares need the
//! trees ([`BranchingStats::of_trees`]); records alone give the rest.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::export::TrajectoryRecord;
use super::forest::{NodeId, Tree};
use crate::env::normalize::normalize_answer;
use crate::env::{Action, ActionKind};
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
    /// Share of sibling leaf pairs whose tool calls on their root-to-leaf paths differ:
    /// the sequences of (tool, trimmed argument) as the environment parsed them (a
    /// final answer and an invalid step are no tool calls). `None` when computed from
    /// records alone, and in logs written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls_differ_share: Option<f64>,
    /// Share of sibling leaf pairs whose observations on their paths differ (every
    /// text the environment answered a step with, tool results and invalid-action
    /// feedback alike, in order). `None` as above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observations_differ_share: Option<f64>,
}

/// One tool call as the environment parsed it: the tool (`None` for a step of an
/// environment that parses its own steps, whose call is then its whole trimmed text)
/// and its trimmed argument.
#[derive(Debug, PartialEq, Eq)]
struct ToolCall<'a> {
    tool: Option<ActionKind>,
    argument: &'a str,
}

/// What a leaf's path did, step by step: its tool calls and the observations the
/// environment answered its steps with.
#[derive(Debug, PartialEq, Eq)]
struct LeafSteps<'a> {
    tool_calls: Vec<ToolCall<'a>>,
    observations: Vec<&'a str>,
}

impl<'a> LeafSteps<'a> {
    /// The steps of `path` in `tree`; `None` when the path is not one of the tree's
    /// (a node it lacks, or a node whose parent is not the one before it): then the
    /// record was not grown in this tree.
    fn of_path(tree: &'a Tree, path: &[NodeId]) -> Option<Self> {
        let mut steps = LeafSteps {
            tool_calls: Vec::new(),
            observations: Vec::new(),
        };
        let mut parent = None;
        for &id in path {
            let node = tree.nodes.get(id.index())?;
            if node.id != id || node.parent != parent {
                return None;
            }
            parent = Some(id);
            match &node.action {
                Some(a @ Action::External { .. }) if a.is_tool_call() => {
                    steps.tool_calls.push(ToolCall {
                        tool: None,
                        argument: node.text.trim(),
                    })
                }
                Some(a) if a.is_tool_call() => steps.tool_calls.push(ToolCall {
                    tool: a.kind(),
                    argument: a.content().unwrap_or_default().trim(),
                }),
                _ => {}
            }
            if let Some(o) = &node.observation {
                steps.observations.push(o);
            }
        }
        Some(steps)
    }
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
    /// Records hold no actions: the tool-call and observation shares are `None` (see
    /// [`of_trees`](Self::of_trees)).
    pub fn of_records(records: &[TrajectoryRecord]) -> Option<Self> {
        Self::measure(records, None)
    }

    /// [`of_records`](Self::of_records) with the tool-call and observation shares,
    /// read from the trees the records' leaves belong to (matched by prompt and tree
    /// id). They stay `None` when some record's path is not in `trees`: a share over
    /// part of the pairs would read as the whole step's.
    pub fn of_trees(records: &[TrajectoryRecord], trees: &[Tree]) -> Option<Self> {
        let by_id: HashMap<(&str, usize), &Tree> = trees
            .iter()
            .map(|t| ((t.prompt_uid.as_str(), t.tree_id), t))
            .collect();
        let steps: Option<Vec<LeafSteps<'_>>> = records
            .iter()
            .map(|r| {
                let tree = by_id.get(&(r.prompt_uid.as_str(), r.tree_id))?;
                LeafSteps::of_path(tree, &r.node_path)
            })
            .collect();
        Self::measure(records, steps.as_deref())
    }

    /// The figures over `records`, with `steps[i]` the steps of record `i` when known.
    fn measure(records: &[TrajectoryRecord], steps: Option<&[LeafSteps<'_>]>) -> Option<Self> {
        let (mut branched, mut leaves, mut forks) = (0usize, 0usize, 0usize);
        let (mut fork_depth, mut leaf_depth, mut own_steps, mut own_tokens) = (0.0, 0.0, 0.0, 0.0);
        let (mut pairs, mut agreeing, mut identical) = (0usize, 0usize, 0usize);
        let (mut calls_differ, mut observations_differ) = (0usize, 0usize);
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
                    if let Some(steps) = steps {
                        let (x, y) = (&steps[i], &steps[j]);
                        calls_differ += usize::from(x.tool_calls != y.tool_calls);
                        observations_differ += usize::from(x.observations != y.observations);
                    }
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
            tool_calls_differ_share: steps.map(|_| mean(calls_differ as f64, pairs)),
            observations_differ_share: steps.map(|_| mean(observations_differ as f64, pairs)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{InvalidReason, RewardMetric, Score, ScoreDetails};
    use crate::rollout::forest::Node;
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

    /// A step below `parent` that took `action` and was answered with `observation`
    /// (a terminal step when there is none), written as `text`.
    fn step(tree: &mut Tree, parent: usize, text: &str, action: Action, observation: Option<&str>) {
        let node = Node {
            depth: tree.nodes[parent].depth + 1,
            text: text.to_string(),
            terminal: observation.is_none(),
            observation: observation.map(str::to_string),
            action: Some(action),
            ..Node::root()
        };
        tree.push_child(NodeId::new(parent), node);
    }

    fn search(q: &str) -> Action {
        Action::Search(q.to_string())
    }

    fn answer_with(a: &str) -> Action {
        Action::Answer(a.to_string())
    }

    #[test]
    fn tool_calls_and_observations_differ_by_hand() {
        // Prompt p, tree 0: one search, then four ways on.
        let mut p = Tree::new("p".into(), 0);
        step(
            &mut p,
            0,
            "",
            search("capital of France"),
            Some("Paris is the capital"),
        );
        step(
            &mut p,
            1,
            "",
            search("Paris population"),
            Some("2.1 million"),
        );
        step(&mut p, 2, "", answer_with("Paris"), None);
        // The same query written with spaces around it: the same call.
        step(
            &mut p,
            1,
            "",
            search("  Paris population "),
            Some("2.1 million"),
        );
        step(&mut p, 4, "", answer_with("Paris"), None);
        // An invalid step is no tool call, but its feedback is an observation.
        let invalid = Action::Invalid(InvalidReason::NoAction);
        step(&mut p, 2, "", invalid, Some("invalid action"));
        step(&mut p, 6, "", answer_with("x"), None);
        step(&mut p, 1, "", answer_with("Lyon"), None);
        // Prompt q, tree 0: the same argument to another tool is another call.
        let mut q = Tree::new("q".into(), 0);
        step(&mut q, 0, "", search("2+2"), Some("4"));
        step(&mut q, 1, "", answer_with("4"), None);
        step(&mut q, 0, "", Action::Calc("2+2".into()), Some("4"));
        step(&mut q, 3, "", answer_with("4"), None);
        // Prompt r, tree 0: an environment that reads its own steps: its calls are
        // their trimmed texts, the same here.
        let mut r = Tree::new("r".into(), 0);
        let call = Action::External { continues: true };
        let end = Action::External { continues: false };
        step(&mut r, 0, " lookup(a) ", call.clone(), Some("A"));
        step(&mut r, 1, "done", end.clone(), None);
        step(&mut r, 0, "lookup(a)", call, Some("A"));
        step(&mut r, 3, "done", end, None);
        let records = [
            leaf("p", 0, &[0, 1, 2, 3], &[1, 2, 3], Some("Paris")),
            leaf("p", 0, &[0, 1, 4, 5], &[1, 4, 3], Some("Paris")),
            leaf("p", 0, &[0, 1, 2, 6, 7], &[1, 2, 6, 7], Some("x")),
            leaf("p", 0, &[0, 1, 8], &[1, 8], Some("Lyon")),
            leaf("q", 0, &[0, 1, 2], &[1, 2], Some("4")),
            leaf("q", 0, &[0, 3, 4], &[3, 4], Some("4")),
            leaf("r", 0, &[0, 1, 2], &[1, 2], None),
            leaf("r", 0, &[0, 3, 4], &[3, 4], None),
        ];
        let trees = [p, q, r];
        let s = BranchingStats::of_trees(&records, &trees).unwrap();
        // p's leaves call [capital, population] (3 and 5: the spaces trimmed, and 7:
        // the invalid step is no call) or [capital] (8); they see [capital's,
        // population's] (3, 5), those and the feedback (7), or [capital's] (8).
        // Pairs 3–5, 3–7, 3–8, 5–7, 5–8, 7–8: calls differ in the three with 8,
        // observations in all but 3–5. q's pair: calls differ, observations do not.
        // r's pair: neither. So 4 of 8 pairs and 5 of 8.
        assert_eq!(s.tool_calls_differ_share, Some(4.0 / 8.0), "{s:?}");
        assert_eq!(s.observations_differ_share, Some(5.0 / 8.0), "{s:?}");
        // The other figures are the records' own.
        let from_records = BranchingStats::of_records(&records).unwrap();
        assert_eq!(
            BranchingStats {
                tool_calls_differ_share: None,
                observations_differ_share: None,
                ..s
            },
            from_records
        );
        // A record whose tree is missing, or whose path is not its tree's (p's tree
        // named r: its node 3 is not below the root): no shares over part of the pairs.
        let mut wrong = trees[0].clone();
        wrong.prompt_uid = "r".into();
        let [p, q, _] = trees;
        for trees in [vec![p.clone(), q.clone()], vec![p, q, wrong]] {
            let s = BranchingStats::of_trees(&records, &trees).unwrap();
            assert_eq!(s, from_records);
        }
    }

    #[test]
    fn logs_before_the_shares_still_read() {
        // Step 1's branching of benchmarks/learning/search-qa's tree-2-4-1 run.
        let old = r#"{"branched_trees": 15, "leaves": 75, "forks": 40, "fork_depth_mean": 0.875,
            "leaf_depth_mean": 2.5733333333333333, "own_steps_mean": 1.7733333333333334,
            "own_token_share": 0.10898706417578073, "answer_agreement": 0.6333333333333333,
            "identical_leaf_share": 0.68}"#;
        let s: BranchingStats = serde_json::from_str(old).unwrap();
        assert_eq!((s.leaves, s.identical_leaf_share), (75, 0.68));
        assert_eq!(s.tool_calls_differ_share, None);
        assert_eq!(s.observations_differ_share, None);
        // And they are not written when unknown, so such a line reads as it was.
        let back: serde_json::Value = serde_json::to_value(s).unwrap();
        assert!(back.get("tool_calls_differ_share").is_none(), "{back}");
    }
}
