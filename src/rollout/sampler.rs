//! The tree sampler (Tree-GRPO) and its chain baseline, over one shared engine.
//!
//! Per prompt: the prompt is prefilled once; M trees start from it (each a fork: the
//! prompt's KV is shared, not recomputed); each tree first grows one chain. Then, L
//! times, N nodes per tree are selected and a branch is grown from each: the branch
//! forks the node's snapshot — a sequence kept at the node's end, with its observation
//! already computed and the logits of its last position in hand — so a branch's first
//! token is sampled without computing anything. With `prefix_reuse` off, a branch
//! instead re-sends its whole prefix as a new prompt, as the reference implementation
//! does, and those tokens are counted as recomputed.
//!
//! All prompts, trees and branches run as concurrent tasks: their steps share the
//! engine's batches, and each waits for its tool without holding the others up.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinSet;

use crate::engine::SeqRng;
use crate::env::Episode;
use crate::kv::SeqId;
use crate::model::TokenId;
use crate::random::Uniform;

use super::branch::{grow_branch, BranchOutcome, BranchStart, Grown};
use super::context::SamplerContext;
use super::cost::ForestCost;
use super::error::RolloutError;
use super::forest::{FailedBranch, Forest, Node, NodeId, Tree};
use super::select::select_nodes;

/// A prompt as the run started it: its episode (the environment's `start`, called
/// once per prompt) and the episode's prompt as token ids.
pub struct PromptStart {
    /// The started episode every tree of the prompt branches from.
    pub episode: Episode,
    /// The episode's prompt (its chat messages through the chat template) as token
    /// ids: the root every tree shares.
    pub prompt_ids: Vec<TokenId>,
}

/// What a node needs at run time: its snapshot sequence and episode state.
struct NodeRuntime {
    snapshot: Option<SeqId>,
    episode: Episode,
}

/// Grows one prompt's forest to the end (or until the token budget stops new branches).
pub async fn sample_prompt_forest(
    ctx: Arc<SamplerContext>,
    prompt_index: u64,
    start: PromptStart,
) -> Result<Forest, RolloutError> {
    let t0 = Instant::now();
    let mut cost = ForestCost::default();
    if !ctx.may_start().await? {
        cost.skipped_branches += ctx.config.shape.trees as u64;
        return Ok(Forest::empty(cost, Vec::new(), t0.elapsed().as_secs_f64()));
    }
    ctx.engine.wait_for_kv_room(ctx.prompt_room_blocks).await?;
    // The prompt, prefilled once: every tree forks from it. Without prefix reuse each
    // chain sends the prompt itself, so no shared root is computed.
    let root = if ctx.config.prefix_reuse {
        match prefill_root(&ctx, &start.prompt_ids, &mut cost).await? {
            Ok(root) => Some(root),
            Err(error) => {
                let failed = vec![FailedBranch::prompt(error)];
                return Ok(Forest::empty(cost, failed, t0.elapsed().as_secs_f64()));
            }
        }
    } else {
        None
    };
    let mut growth = Growth::new(ctx, prompt_index, start, root, cost);
    let grown = growth.grow().await;
    // Release every snapshot, also after an error.
    growth.free_snapshots().await?;
    grown?;
    Ok(growth.finish(t0.elapsed().as_secs_f64()))
}

/// One prompt's forest while it grows: its trees, what each node needs at run time,
/// the branch ids drawn so far, the branches that failed, and what it cost.
struct Growth {
    ctx: Arc<SamplerContext>,
    prompt_index: u64,
    prompt_ids: Vec<TokenId>,
    /// The prompt's prefilled sequence every tree forks from (with prefix reuse).
    root: Option<SeqId>,
    trees: Vec<Tree>,
    /// Per tree: its nodes' snapshots and episodes.
    runtime: Vec<HashMap<NodeId, NodeRuntime>>,
    /// Per tree: the next branch id.
    branch_counter: Vec<u64>,
    failed: Vec<FailedBranch>,
    cost: ForestCost,
}

/// A branch's task: its tree, branch id and start node, and what growing it came to.
type BranchJobs = JoinSet<(usize, u64, NodeId, Result<BranchOutcome, RolloutError>)>;

impl Growth {
    /// M trees of the root alone, each root holding the prompt's episode.
    fn new(
        ctx: Arc<SamplerContext>,
        prompt_index: u64,
        start: PromptStart,
        root: Option<SeqId>,
        cost: ForestCost,
    ) -> Self {
        let PromptStart {
            episode,
            prompt_ids,
        } = start;
        let m = ctx.config.shape.trees;
        let uid = episode.sample().id.to_string();
        let runtime = (0..m)
            .map(|_| {
                HashMap::from([(
                    NodeId::ROOT,
                    NodeRuntime {
                        snapshot: root,
                        episode: episode.clone(),
                    },
                )])
            })
            .collect();
        Growth {
            ctx,
            prompt_index,
            prompt_ids,
            root,
            trees: (0..m).map(|t| Tree::new(uid.clone(), t)).collect(),
            runtime,
            branch_counter: vec![0; m],
            failed: Vec::new(),
            cost,
        }
    }

    /// Round 0: one chain per tree; rounds 1..=L: N branches per tree. Each round's
    /// branches grow concurrently and are added when all of them are done.
    async fn grow(&mut self) -> Result<(), RolloutError> {
        for round in 0..=self.ctx.config.shape.rounds {
            let jobs = self.start_round(round).await?;
            self.finish_round(jobs).await?;
        }
        Ok(())
    }

    /// Starts the round's branches of every tree, from the nodes it selects.
    async fn start_round(&mut self, round: usize) -> Result<BranchJobs, RolloutError> {
        let mut jobs = JoinSet::new();
        for t in 0..self.trees.len() {
            for start in self.branch_starts(t, round) {
                self.start_branch(&mut jobs, round, t, start).await?;
            }
        }
        Ok(jobs)
    }

    /// The nodes tree `t` grows branches from in `round`: its root in round 0, then
    /// the selected ones.
    fn branch_starts(&self, t: usize, round: usize) -> Vec<NodeId> {
        if round == 0 {
            return vec![NodeId::ROOT];
        }
        let cfg = &self.ctx.config;
        let mut rng = SeqRng::from_parts(&[
            cfg.seed,
            self.prompt_index,
            t as u64,
            round as u64,
            SELECT_SALT,
        ]);
        select_nodes(
            cfg.shape.selection,
            &self.trees[t],
            cfg.shape.expand,
            &mut rng,
        )
    }

    /// Starts one branch of tree `t` from `start` as a task, unless the token budget
    /// is spent (then it is counted as skipped).
    async fn start_branch(
        &mut self,
        jobs: &mut BranchJobs,
        round: usize,
        t: usize,
        start: NodeId,
    ) -> Result<(), RolloutError> {
        let ctx = &self.ctx;
        let cfg = &ctx.config;
        // Branch ids are drawn even for skipped branches, so a budget never changes
        // the seeds of the branches that do run.
        let branch = self.branch_counter[t];
        self.branch_counter[t] += 1;
        if !ctx.may_start().await? {
            self.cost.skipped_branches += 1;
            return Ok(());
        }
        ctx.engine.wait_for_kv_room(0).await?;
        let rt = &self.runtime[t][&start];
        let from = match (cfg.prefix_reuse, rt.snapshot) {
            (true, Some(snapshot)) => BranchStart::Fork(snapshot),
            (true, None) => {
                return Err(RolloutError::NoSnapshot {
                    tree: t,
                    node: start.index(),
                })
            }
            (false, _) => BranchStart::Resend {
                prefix: prefix_tokens(&self.prompt_ids, &self.trees[t], start),
                // Everything but the very first chain re-sends tokens computed before.
                recomputed: round > 0 || t > 0,
            },
        };
        let ep = rt.episode.clone();
        let depth = self.trees[t][start].depth;
        let seed = vec![cfg.seed, self.prompt_index, t as u64, branch];
        // A branch's first step may be drawn wider (diversity at the fork); round 0's
        // root chains never are.
        let boost = match &cfg.branch_sampling {
            Some(b) if round > 0 => b.boost_for(&seed, cfg.max_step_tokens),
            _ => None,
        };
        let ctx = ctx.clone();
        jobs.spawn(async move {
            let grown = grow_branch(&ctx, from, ep, depth, seed, boost).await;
            (t, branch, start, grown)
        });
        Ok(())
    }

    /// Waits for the round's branches, records the failed ones, and adds the grown
    /// steps to their trees.
    async fn finish_round(&mut self, mut jobs: BranchJobs) -> Result<(), RolloutError> {
        let mut results = Vec::new();
        while let Some(joined) = jobs.join_next().await {
            let (t, branch, start, grown) = joined.map_err(|source| RolloutError::Task {
                task: "branch",
                source,
            })?;
            let outcome = grown?;
            self.cost.add(&outcome.cost);
            match outcome.failure {
                None => results.push((t, branch, start, outcome.grown)),
                Some((steps_done, error)) => self.failed.push(FailedBranch {
                    tree: Some(t),
                    branch,
                    start_node: start,
                    steps_done,
                    error,
                }),
            }
        }
        // Insert in a fixed order so node ids do not depend on task timing.
        results.sort_by_key(|&(t, branch, _, _)| (t, branch));
        for (t, _, start, chain) in results {
            self.add_chain(t, start, chain);
        }
        Ok(())
    }

    /// Adds a grown branch's steps to tree `t`, each the child of the one before.
    fn add_chain(&mut self, t: usize, start: NodeId, chain: Vec<Grown>) {
        let mut parent = start;
        for g in chain {
            let id = self.trees[t].push_child(parent, g.node);
            self.runtime[t].insert(
                id,
                NodeRuntime {
                    snapshot: g.snapshot,
                    episode: g.episode,
                },
            );
            parent = id;
        }
    }

    /// Frees every node's snapshot; the root is shared by all trees. Snapshots compute
    /// nothing and consume nothing, so only the root's usage counts.
    async fn free_snapshots(&mut self) -> Result<(), RolloutError> {
        let mut freed = HashSet::new();
        for rt in self.runtime.iter().flat_map(|m| m.values()) {
            if let Some(s) = rt.snapshot {
                if freed.insert(s) {
                    let usage = self.ctx.free(s).await?;
                    if Some(s) == self.root {
                        self.cost.usage.add(&usage);
                    } else {
                        self.cost.add_snapshot_usage(&usage);
                    }
                }
            }
        }
        Ok(())
    }

    /// The finished forest: trees that got a chain, each cut to its K kept leaves.
    fn finish(self, wall_seconds: f64) -> Forest {
        let Growth {
            ctx,
            prompt_index,
            mut trees,
            mut failed,
            cost,
            ..
        } = self;
        let cfg = &ctx.config;
        // Trees that never got a chain (the budget ran out first) are not exported.
        trees.retain(|t| t.nodes.len() > 1);
        if let Some(k) = cfg.shape.keep {
            for tree in trees.iter_mut() {
                let mut rng =
                    SeqRng::from_parts(&[cfg.seed, prompt_index, tree.tree_id as u64, KEEP_SALT]);
                keep_leaves(tree, k, &mut rng);
            }
        }
        failed.sort_by_key(|f| (f.tree, f.branch));
        Forest {
            trees,
            failed,
            cost,
            wall_seconds,
        }
    }
}

/// Adds and prefills the prompt every tree forks from. `Ok(Err(message))` when the
/// prompt itself cannot fit the KV pool or the context window.
async fn prefill_root(
    ctx: &SamplerContext,
    prompt_ids: &[TokenId],
    cost: &mut ForestCost,
) -> Result<Result<SeqId, String>, RolloutError> {
    let root = match ctx.add_sequence(prompt_ids.to_vec()).await {
        Ok(root) => root,
        Err(e) if e.is_sequence_limit() => return Ok(Err(e.to_string())),
        Err(e) => return Err(e.into()),
    };
    match ctx.engine.prefill(root).await {
        Ok(()) => Ok(Ok(root)),
        Err(e) => {
            cost.usage.add(&ctx.free(root).await?);
            if e.is_sequence_limit() {
                Ok(Err(e.to_string()))
            } else {
                Err(e.into())
            }
        }
    }
}

/// Prompt plus every token on the path to `node` (model and observation tokens).
fn prefix_tokens(prompt: &[TokenId], tree: &Tree, node: NodeId) -> Vec<TokenId> {
    let mut out = prompt.to_vec();
    for id in tree.path(node).into_iter().skip(1) {
        let n = &tree[id];
        out.extend_from_slice(&n.tokens);
        out.extend_from_slice(&n.obs_tokens);
    }
    out
}

/// Seed salt of the node selection of a round (`[seed, prompt, tree, round, salt]`).
const SELECT_SALT: u64 = 0x5E1;
/// Seed salt of the K kept leaves of a tree (`[seed, prompt, tree, salt]`).
const KEEP_SALT: u64 = 0x4EE9;

/// Keeps `k` leaves chosen at random and drops nodes left without a leaf below.
fn keep_leaves(tree: &mut Tree, k: usize, rng: &mut SeqRng) {
    let mut leaves: Vec<NodeId> = tree.leaves().map(|n| n.id).collect();
    if leaves.len() <= k {
        return;
    }
    rng.shuffle_first(&mut leaves, k);
    leaves.truncate(k);
    let mut keep = vec![false; tree.nodes.len()];
    for &l in &leaves {
        for id in tree.path(l) {
            keep[id.index()] = true;
        }
    }
    // Kept nodes keep their order, each renumbered to its new index; a kept node's
    // parent is on its path, so it is kept too.
    let mut nodes: Vec<Node> = tree
        .nodes
        .iter()
        .filter(|n| keep[n.id.index()])
        .cloned()
        .collect();
    let mut remap = vec![None; tree.nodes.len()];
    for (i, n) in nodes.iter_mut().enumerate() {
        remap[n.id.index()] = Some(NodeId::new(i));
        n.id = NodeId::new(i);
    }
    for n in nodes.iter_mut() {
        n.parent = n.parent.and_then(|p| remap[p.index()]);
    }
    tree.nodes = nodes;
}
