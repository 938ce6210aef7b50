//! From finished trees to what trainers read: per-leaf trajectories with advantages,
//! and the trees themselves with step values.

use crate::advantage::{
    leaf_advantages, step_values, AdvantageError, AdvantageMode, NodeIdx, NodeView, PromptForest,
    TreeView,
};
use crate::model::TokenId;

use super::forest::{NodeId, Tree};
use super::trajectory::Trajectory;

/// One line of `trajectories.jsonl`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TrajectoryRecord {
    /// The sample (prompt) the trajectory answers; trajectories of one prompt form
    /// its advantage group.
    pub prompt_uid: String,
    /// The tree it ends in, by index among its prompt's trees.
    pub tree_id: usize,
    /// Its leaf node in that tree.
    pub leaf_id: NodeId,
    /// Node ids from the root to the leaf, both included (the steps it shares with
    /// other trajectories of the tree are a common prefix of their paths).
    pub node_path: Vec<NodeId>,
    /// The tokens, masks, logprobs and reward (flattened into the record's JSON).
    #[serde(flatten)]
    pub trajectory: Trajectory,
    /// The leaf's advantage under the run's advantage mode: the weight of every
    /// model token of the trajectory in the policy-gradient loss.
    pub advantage: f64,
    /// The temperature `response_logprobs` were taken under (the rollout's sampling
    /// temperature; 1 for greedy): the trainer scores under the same. Absent in files
    /// written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
}

/// The advantage module's view of a prompt's trees.
fn views(trees: &[Tree]) -> Vec<TreeView> {
    trees.iter().map(Tree::advantage_view).collect()
}

impl Tree {
    /// The tree as the advantage module reads it: parent links, leaf rewards (a
    /// terminal node's), and each node's loss mask (its model tokens 1, its
    /// observation tokens 0). What `score_forest` scores, and what a caller of
    /// [`run_rollout`](super::run_rollout) hands [`PromptForest::new`] to compute
    /// advantages of its own.
    pub fn advantage_view(&self) -> TreeView {
        TreeView {
            nodes: self
                .nodes
                .iter()
                .map(|n| {
                    let base = match (n.parent.map(NodeId::index), n.reward) {
                        (None, _) => NodeView::root(),
                        (Some(p), Some(r)) if n.terminal => NodeView::leaf(Some(p), r),
                        (Some(p), _) => NodeView::step(p),
                    };
                    let mut mask = vec![true; n.tokens.len()];
                    mask.extend(std::iter::repeat_n(false, n.obs_tokens.len()));
                    base.with_loss_mask(mask)
                })
                .collect(),
        }
    }
}

/// Fills in values and advantages on the trees and returns one record per leaf.
pub fn score_forest(
    prompt_ids: &[TokenId],
    trees: &mut [Tree],
    mode: AdvantageMode,
) -> Result<Vec<TrajectoryRecord>, AdvantageError> {
    let forest = PromptForest::new(views(trees))?;
    let leaf_adv = leaf_advantages(&forest, mode);
    let values = step_values(&forest);
    for (t, tree) in trees.iter_mut().enumerate() {
        for (n, node) in tree.nodes.iter_mut().enumerate() {
            if let Some(v) = values.trees.get(t).and_then(|vs| vs.get(n)) {
                node.value = Some(v.value);
                node.advantage = Some(v.advantage);
            }
            if let Some(a) = leaf_adv.get(t, NodeIdx(n)) {
                node.advantage = Some(a);
            }
        }
    }
    let mut records = Vec::new();
    for (t, tree) in trees.iter().enumerate() {
        for leaf in tree.leaves() {
            let path = tree.path(leaf.id);
            let mut traj = Trajectory::new(prompt_ids.to_vec());
            for &id in path.iter().skip(1) {
                let n = &tree[id];
                traj.push_model(&n.tokens, &n.logprobs, &n.behaviour_logprobs, n.boosted);
                traj.push_observation(&n.obs_tokens);
            }
            traj.reward = leaf.reward.unwrap_or(0.0);
            traj.score = leaf.score.clone();
            traj.num_turns = leaf.depth;
            records.push(TrajectoryRecord {
                prompt_uid: tree.prompt_uid.clone(),
                tree_id: t,
                leaf_id: leaf.id,
                node_path: path,
                trajectory: traj,
                advantage: leaf_adv.get(t, NodeIdx(leaf.id.index())).unwrap_or(0.0),
                temperature: None,
            });
        }
    }
    Ok(records)
}
