//! One branch of a tree: from a node's snapshot (or, without prefix reuse, a re-sent
//! prefix) to the end of its episode, through the shared agent loop. Each non-final
//! step's observation is computed and the node's end kept as a snapshot sequence, so
//! later branches from it fork instead of recomputing.

use async_trait::async_trait;

use crate::engine::{BoostedStart, EngineError};
use crate::env::{run_agent_loop, Episode, ModelStep, StepDone, StepModel};
use crate::kv::SeqId;
use crate::model::TokenId;

use super::context::SamplerContext;
use super::cost::ForestCost;
use super::episode::EngineSteps;
use super::error::RolloutError;
use super::forest::Node;

/// What growing one branch came to.
pub(super) struct BranchOutcome {
    pub(super) grown: Vec<Grown>,
    pub(super) cost: ForestCost,
    /// Steps completed and the error, when a sequence limit or the environment's own
    /// failure stopped the branch.
    pub(super) failure: Option<(usize, String)>,
}

/// A step node as grown, plus what is needed to branch from it later.
pub(super) struct Grown {
    pub(super) node: Node,
    /// The sequence kept at the node's end (inner nodes only).
    pub(super) snapshot: Option<SeqId>,
    pub(super) episode: Episode,
}

/// Where a branch's sequence starts.
pub(super) enum BranchStart {
    /// A fork of the node's snapshot: the prefix is shared, nothing is recomputed.
    Fork(SeqId),
    /// The whole prefix re-sent as a new prompt, as the reference implementation does;
    /// `recomputed` when those tokens were computed before (every branch but a
    /// prompt's very first chain), so they count as recomputed.
    Resend {
        prefix: Vec<TokenId>,
        recomputed: bool,
    },
}

/// A branch as the agent loop's model: its sequence generates each step, each
/// non-final step's observation is computed and the node's end kept as a snapshot.
pub(super) struct BranchModel<'a> {
    ctx: &'a SamplerContext,
    /// The branch's sequence; the seed words of the branch, the step's depth appended.
    steps: EngineSteps<'a>,
    pub(super) grown: Vec<Grown>,
    pub(super) cost: ForestCost,
}

#[async_trait]
impl StepModel for BranchModel<'_> {
    type Error = RolloutError;

    async fn step(&mut self, depth: usize) -> Result<ModelStep, RolloutError> {
        self.steps.step(depth).await
    }

    async fn observe(&mut self, observation: &str) -> Result<Vec<TokenId>, RolloutError> {
        let ids = self.steps.observe(observation).await?;
        self.cost.observation_tokens += ids.len() as u64;
        Ok(ids)
    }

    async fn step_done(&mut self, done: StepDone, episode: &Episode) -> Result<(), RolloutError> {
        let engine = &self.ctx.engine;
        if done.tool_call {
            self.cost.tool_calls += 1;
        }
        let outcome = done.outcome;
        let mut node = Node::root();
        node.depth = done.index + 1;
        node.tokens = done.step.tokens;
        node.logprobs = done.step.logprobs;
        node.behaviour_logprobs = done.step.behaviour_logprobs;
        node.boosted = done.step.boosted;
        node.text = done.step.text;
        node.action = Some(outcome.action);
        node.observation = outcome.observation;
        node.terminal = outcome.done;
        node.obs_tokens = done.observation;
        let mut snapshot = None;
        if outcome.done {
            let score = self.ctx.env.score(episode);
            node.reward = Some(score.reward);
            node.score = Some(score);
        } else {
            // Compute the observation now and keep a snapshot of the node's end, so
            // later branches from here start without recomputing anything.
            engine.prefill(self.steps.seq).await?;
            if self.ctx.config.prefix_reuse && self.ctx.config.shape.rounds > 0 {
                snapshot = Some(self.ctx.fork(self.steps.seq).await?);
            }
        }
        self.grown.push(Grown {
            node,
            snapshot,
            episode: episode.clone(),
        });
        Ok(())
    }
}

/// Whether an error ends only the branch it happened in.
fn ends_branch(e: &RolloutError) -> bool {
    match e {
        RolloutError::Engine(e) => e.is_sequence_limit(),
        RolloutError::Env(e) => e.is_episode_failure(),
        _ => false,
    }
}

/// Grows a branch from a node (at `start_depth`) to the end of its episode.
pub(super) async fn grow_branch(
    ctx: &SamplerContext,
    start: BranchStart,
    mut episode: Episode,
    start_depth: usize,
    seed: Vec<u64>,
    boost: Option<BoostedStart>,
) -> Result<BranchOutcome, RolloutError> {
    let engine = &ctx.engine;
    let mut cost = ForestCost::default();
    let failed = |cost, e: EngineError| BranchOutcome {
        grown: Vec::new(),
        cost,
        failure: Some((0, e.to_string())),
    };
    let seq = match start {
        BranchStart::Fork(snapshot) => ctx.fork(snapshot).await?,
        BranchStart::Resend { prefix, recomputed } => {
            match ctx.add_sequence(prefix.clone()).await {
                Ok(seq) => {
                    if recomputed {
                        cost.recomputed += prefix.len() as u64;
                    }
                    seq
                }
                Err(e) if e.is_sequence_limit() => return Ok(failed(cost, e)),
                Err(e) => return Err(e.into()),
            }
        }
    };
    let mut branch = BranchModel {
        ctx,
        steps: EngineSteps {
            engine,
            seq,
            sampling: ctx.config.sampling,
            max_step_tokens: ctx.config.max_step_tokens,
            seed,
            stop_strings: ctx.env.stop_strings(),
            stop_tokens: engine.model().tokenizer.eos_ids().to_vec(),
            boost: boost.map(|b| (start_depth, b)),
        },
        grown: Vec::new(),
        cost,
    };
    let result = run_agent_loop(ctx.env.as_ref(), &mut episode, &mut branch, start_depth).await;
    let BranchModel {
        grown, mut cost, ..
    } = branch;
    cost.usage.add(&ctx.free(seq).await?);
    match result {
        Ok(()) => Ok(BranchOutcome {
            grown,
            cost,
            failure: None,
        }),
        // One sequence of this branch cannot fit, or a user-defined environment failed
        // on this episode: the branch fails, the run goes on.
        Err(e) if ends_branch(&e) => {
            for g in &grown {
                if let Some(s) = g.snapshot {
                    cost.add_snapshot_usage(&ctx.free(s).await?);
                }
            }
            Ok(BranchOutcome {
                grown: Vec::new(),
                cost,
                failure: Some((grown.len(), e.to_string())),
            })
        }
        Err(e) => Err(e),
    }
}
