//! A whole rollout run: every prompt's forest grown concurrently on one engine, scored,
//! and written out as soon as it (and every prompt before it) is finished, so an
//! interrupted run keeps every finished tree and the same seed always writes the same
//! bytes whatever finishes first.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::advantage::AdvantageMode;
use crate::engine::{Engine, EngineCounters, EngineStats};
use crate::env::{Environment, QaSample};
use crate::kv::SeqId;
use crate::model::{LoadedModel, TokenId};

use super::branching::BranchingStats;
use super::config::TreeConfig;
use super::context::SamplerContext;
use super::cost::ForestCost;
use super::error::RolloutError;
use super::export::{score_forest, TrajectoryRecord};
use super::forest::{Forest, Tree};
use super::in_order::{Finished, InOrderWriter};
use super::output::Output;
use super::sampler::{sample_prompt_forest, PromptStart};
use super::summary::{ForestSummary, RunSummary, TokenSummary};

/// A new prompt starts only while at least 1/this of the KV pool is free or
/// evictable (and nothing waits for room): under memory pressure the run finishes
/// the forests it has before it starts more, instead of preempting more.
const PROMPT_ROOM_FRACTION: usize = 8;

/// How a run is driven, beyond the shape of its trees.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// How leaf advantages are computed from the rewards (see
    /// [`TreeConfig::default_advantage`](super::TreeConfig::default_advantage) for the
    /// usual choice).
    pub advantage: AdvantageMode,
    /// Stop starting branches once this many tokens were computed (`--token-budget`).
    pub token_budget: Option<u64>,
    /// Most prompts whose forests grow at once (0: all). More prompts fill larger
    /// batches; fewer keep KV use and the budget's overrun small.
    pub max_concurrent_prompts: usize,
    /// The index of this run's first prompt in a larger run it is part of: prompt `i`
    /// is seeded (and reported in `summary.forests`) as prompt `prompt_offset + i`, so
    /// a prompt rolled out alone, or on another replica, gives the trajectories it
    /// gives in the whole run.
    pub prompt_offset: usize,
}

impl RunOptions {
    /// A run with `advantage`, no token budget, every prompt at once, starting at
    /// prompt 0.
    pub fn new(advantage: AdvantageMode) -> Self {
        RunOptions {
            advantage,
            token_budget: None,
            max_concurrent_prompts: 0,
            prompt_offset: 0,
        }
    }
}

/// Progress after each finished prompt.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Prompts whose forests are finished.
    pub prompts_done: usize,
    /// Prompts in the run.
    pub prompts: usize,
    /// Trajectories (kept leaves) finished so far.
    pub rollouts: usize,
    /// Tokens the engine computed since the run started (prefilled, decoded and
    /// recomputed after preemption).
    pub computed_tokens: u64,
    /// Wall-clock seconds since the run started.
    pub seconds: f64,
}

/// A future that resolves when the run should stop early (e.g. on SIGINT).
pub type Interrupt = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What to roll out: the environment and its prompts, the shape of the search (tree or
/// chains, sampling, seed) and how the run is driven (advantage, budget, concurrency).
pub struct RolloutRequest {
    /// The environment every episode runs in.
    pub env: Arc<dyn Environment>,
    /// The prompts, one forest each, in the order results are reported.
    pub samples: Vec<QaSample>,
    /// The search: tree shape (or chains), sampling, step length, seed.
    pub config: TreeConfig,
    /// Advantage mode, token budget, concurrency, prompt offset.
    pub options: RunOptions,
}

/// A finished run in memory: the summary, every trajectory and every tree, in prompt
/// order (what `--out DIR` writes, for callers that keep it in memory instead).
#[derive(Debug)]
pub struct RolloutResult {
    /// What `summary.json` holds: the config, per-prompt and overall figures.
    pub summary: RunSummary,
    /// One per kept leaf, with its advantage (the lines of `trajectories.jsonl`).
    pub records: Vec<TrajectoryRecord>,
    /// Every tree, with node values and advantages filled in (the lines of
    /// `forest.jsonl`).
    pub trees: Vec<Tree>,
}

/// A progress callback, called from the run's task after each finished prompt (so a
/// server or a Python caller can forward it from another thread).
pub type ProgressFn = Box<dyn FnMut(Progress) + Send>;

/// Optional ways to watch, keep or stop a run.
#[derive(Default)]
pub struct RunHooks {
    /// Files written as prompts finish, in prompt order (`--out DIR`).
    pub output: Option<Output>,
    /// Called after each finished prompt.
    pub progress: Option<ProgressFn>,
    /// Resolves when the run should stop early (SIGINT in the CLI).
    pub interrupt: Option<Interrupt>,
}

/// Runs every sample's forest and returns the whole result (writing `hooks.output`
/// as prompts finish, if given).
///
/// When `hooks.interrupt` resolves, forests still growing are abandoned (their
/// sequences are freed), every finished forest is kept and written, and the summary
/// says `interrupted`.
pub async fn run_rollout(
    engine: Engine,
    request: RolloutRequest,
    hooks: RunHooks,
) -> Result<RolloutResult, RolloutError> {
    let RolloutRequest {
        env,
        samples,
        config,
        options,
    } = request;
    config.validate()?;
    let t0 = Instant::now();
    let stats = engine.stats().await?;
    let starts = start_prompts(env.as_ref(), &samples, engine.model())?;
    let prompts = prompt_tokens(&starts);
    let shared = if config.prefix_reuse {
        prefill_shared_prefix(&engine, &prompts, stats.kv.block_size).await?
    } else {
        None
    };
    let ctx = sampler_context(&engine, env, &config, &options, &stats);
    let n = samples.len();
    let mut writer = InOrderWriter::new(hooks.output);
    let mut jobs = spawn_prompts(&ctx, starts, &options);
    let scoring = Scoring {
        prompts: &prompts,
        samples: &samples,
        config: &config,
        options: &options,
    };
    let mut reporter = ProgressReporter {
        engine: &engine,
        callback: hooks.progress,
        prompts: n,
        computed_before: stats.counters.computed(),
        t0,
        done: 0,
    };
    let mut interrupt = hooks
        .interrupt
        .unwrap_or_else(|| Box::pin(std::future::pending()));
    let interrupted = collect_forests(
        &mut jobs,
        &mut interrupt,
        &scoring,
        &mut writer,
        &mut reporter,
    )
    .await?;
    if interrupted {
        abandon_growing(&mut jobs, &ctx).await;
        writer.keep_every_finished()?;
    }
    let shared_prefix = free_shared_prefix(&engine, shared).await?;
    let after = engine.stats().await?.counters;
    let (out, kept) = writer.into_parts();
    let summary = summarize(
        &ctx,
        shared_prefix,
        kept.forests,
        &kept.records,
        &kept.trees,
        n,
        &after,
        &stats,
        t0.elapsed().as_secs_f64(),
        &options,
        interrupted,
    );
    if let Some(o) = out.as_ref() {
        o.write_summary(&summary)?;
    }
    Ok(RolloutResult {
        summary,
        records: kept.records,
        trees: kept.trees,
    })
}

/// What every task of the run shares: the engine and environment, the search, the
/// token budget counted from the engine's computed tokens at the start (`stats`), and
/// the KV room a new prompt needs.
fn sampler_context(
    engine: &Engine,
    env: Arc<dyn Environment>,
    config: &TreeConfig,
    options: &RunOptions,
    stats: &EngineStats,
) -> Arc<SamplerContext> {
    Arc::new(SamplerContext {
        engine: engine.clone(),
        env,
        config: config.clone(),
        token_budget: options.token_budget,
        computed_at_start: stats.counters.computed(),
        budget_spent: AtomicBool::new(false),
        prompt_room_blocks: stats.kv.num_blocks / PROMPT_ROOM_FRACTION,
        live: Default::default(),
    })
}

/// A prompt's episode as it started, or why it could not start (that prompt's forest
/// is then a failed one; the run goes on).
type PromptStarted = Result<PromptStart, String>;

/// The tasks growing the prompts' forests, each giving back its prompt's index.
type PromptJobs = JoinSet<(usize, Result<Forest, RolloutError>)>;

/// Starts each prompt's episode, once, here: a user-defined environment's `start` may
/// have effects, and one that fails with an episode failure fails only its prompt
/// (any other error stops the run).
fn start_prompts(
    env: &dyn Environment,
    samples: &[QaSample],
    model: &LoadedModel,
) -> Result<Vec<PromptStarted>, RolloutError> {
    let mut starts = Vec::with_capacity(samples.len());
    for q in samples {
        starts.push(match env.start(q) {
            Ok(episode) => {
                let prompt_ids = model.chat_prompt(episode.prompt())?;
                Ok(PromptStart {
                    episode,
                    prompt_ids,
                })
            }
            Err(e) if e.is_episode_failure() => Err(e.to_string()),
            Err(e) => return Err(e.into()),
        });
    }
    Ok(starts)
}

/// Each prompt's token ids (empty for a prompt that failed to start).
fn prompt_tokens(starts: &[PromptStarted]) -> Vec<Vec<TokenId>> {
    starts
        .iter()
        .map(|s| {
            s.as_ref()
                .map_or_else(|_| Vec::new(), |s| s.prompt_ids.clone())
        })
        .collect()
}

/// Spawns one task per prompt, growing its forest (or recording its failed start)
/// under at most `options.max_concurrent_prompts` at once (0: all).
///
/// Prompts take their permits in prompt order: tasks are first polled in no
/// particular order, and since the files are written in prompt order, a first prompt
/// that started last would hold every finished forest back until the end (with one
/// prompt at a time, nothing written until the run was over, so an interrupted run
/// kept nothing on disk). `next_in_line` is the prompt whose turn it is to take a
/// permit.
fn spawn_prompts(
    ctx: &Arc<SamplerContext>,
    starts: Vec<PromptStarted>,
    options: &RunOptions,
) -> PromptJobs {
    let n = starts.len();
    let permits = Arc::new(Semaphore::new(match options.max_concurrent_prompts {
        0 => n.max(1),
        k => k,
    }));
    let (next_in_line, _) = tokio::sync::watch::channel(0usize);
    let next_in_line = Arc::new(next_in_line);
    let mut jobs = JoinSet::new();
    let offset = options.prompt_offset;
    for (i, start) in starts.into_iter().enumerate() {
        let ctx = ctx.clone();
        let permits = permits.clone();
        let next_in_line = next_in_line.clone();
        jobs.spawn(async move {
            let mut turn = next_in_line.subscribe();
            // The sender lives as long as this task's `Arc`, so the wait cannot fail.
            let _ = turn.wait_for(|&next| next == i).await;
            let _permit = permits.acquire_owned().await;
            next_in_line.send_modify(|next| *next += 1);
            let forest = match start {
                Ok(start) => sample_prompt_forest(ctx, (offset + i) as u64, start).await,
                Err(error) => Ok(Forest::failed_prompt(error)),
            };
            (i, forest)
        });
    }
    jobs
}

/// Takes each prompt's forest as its task finishes — scored, written in prompt order,
/// progress reported — until every task is done or `interrupt` resolves. Returns
/// whether the interrupt ended it.
async fn collect_forests(
    jobs: &mut PromptJobs,
    interrupt: &mut Interrupt,
    scoring: &Scoring<'_>,
    writer: &mut InOrderWriter,
    reporter: &mut ProgressReporter<'_>,
) -> Result<bool, RolloutError> {
    loop {
        let joined = tokio::select! {
            j = jobs.join_next() => match j {
                Some(j) => j,
                None => return Ok(false),
            },
            _ = &mut *interrupt => return Ok(true),
        };
        let (i, forest) = joined.map_err(|source| RolloutError::Task {
            task: "prompt",
            source,
        })?;
        writer.insert(i, scoring.finish(i, forest?)?)?;
        reporter.prompt_done(writer).await?;
    }
}

/// Abandons the forests still growing after an interrupt: waits until every task is
/// gone, then frees what their sequences left.
async fn abandon_growing(jobs: &mut PromptJobs, ctx: &SamplerContext) {
    jobs.abort_all();
    while jobs.join_next().await.is_some() {}
    ctx.free_all_left().await;
}

/// Frees the shared prefix's sequence, if one was prefilled, and gives what it cost.
async fn free_shared_prefix(
    engine: &Engine,
    shared: Option<SeqId>,
) -> Result<TokenSummary, RolloutError> {
    Ok(match shared {
        Some(seq) => TokenSummary::from_cost(&ForestCost {
            usage: engine.free(seq).await?,
            ..ForestCost::default()
        }),
        None => TokenSummary::default(),
    })
}

/// What turns a prompt's grown forest into its scored records and summary.
struct Scoring<'a> {
    /// Every prompt's token ids, by prompt index.
    prompts: &'a [Vec<TokenId>],
    /// The run's prompts.
    samples: &'a [QaSample],
    /// The search (its sampling gives the records' temperature).
    config: &'a TreeConfig,
    /// The advantage mode and the prompt offset.
    options: &'a RunOptions,
}

impl Scoring<'_> {
    /// Prompt `i`'s forest scored: its leaves' records with advantages and the
    /// sampling temperature, and its summary.
    fn finish(&self, i: usize, mut forest: Forest) -> Result<Finished, RolloutError> {
        let mut records = if forest.trees.is_empty() {
            Vec::new()
        } else {
            score_forest(&self.prompts[i], &mut forest.trees, self.options.advantage)?
        };
        for r in &mut records {
            r.temperature = Some(self.config.sampling.logprob_temperature());
        }
        let summary = forest_summary(
            self.options.prompt_offset + i,
            &self.samples[i],
            &forest,
            &records,
        );
        Ok(Finished {
            records,
            trees: forest.trees,
            summary,
        })
    }
}

/// Reports [`Progress`] after each finished prompt.
struct ProgressReporter<'a> {
    /// The engine whose counters give the computed tokens.
    engine: &'a Engine,
    /// The caller's callback, if any.
    callback: Option<ProgressFn>,
    /// Prompts in the run.
    prompts: usize,
    /// The engine's computed tokens when the run started.
    computed_before: u64,
    /// When the run started.
    t0: Instant,
    /// Prompts finished so far.
    done: usize,
}

impl ProgressReporter<'_> {
    /// Counts one more finished prompt and reports where the run stands.
    async fn prompt_done(&mut self, writer: &InOrderWriter) -> Result<(), RolloutError> {
        self.done += 1;
        let c = self.engine.stats().await?.counters;
        if let Some(progress) = self.callback.as_mut() {
            progress(Progress {
                prompts_done: self.done,
                prompts: self.prompts,
                rollouts: writer.rollouts(),
                computed_tokens: c.computed() - self.computed_before,
                seconds: self.t0.elapsed().as_secs_f64(),
            });
        }
        Ok(())
    }
}

/// Prefills the longest prefix every started prompt shares (whole KV blocks of it),
/// so the prompts find it in the prefix cache. Returns the sequence holding it, or
/// `None` when the prompts share less than a block.
async fn prefill_shared_prefix(
    engine: &Engine,
    prompts: &[Vec<TokenId>],
    block_size: usize,
) -> Result<Option<SeqId>, RolloutError> {
    // Prompts that failed to start have no tokens and share nothing.
    let started: Vec<Vec<TokenId>> = prompts.iter().filter(|p| !p.is_empty()).cloned().collect();
    let Some(first) = started.first() else {
        return Ok(None);
    };
    if started.len() < 2 {
        return Ok(None);
    }
    let mut common = first.len();
    for p in &started[1..] {
        common = common.min(first.iter().zip(p).take_while(|(a, b)| a == b).count());
    }
    // Only full blocks are found by the prefix index; and a prompt must keep at least
    // one token of its own to compute (its logits start the generation).
    let common = (common.min(first.len() - 1) / block_size.max(1)) * block_size.max(1);
    if common == 0 {
        return Ok(None);
    }
    let seq = engine.add_sequence(first[..common].to_vec()).await?;
    engine.prefill(seq).await?;
    Ok(Some(seq))
}

fn mean_reward(records: &[TrajectoryRecord]) -> f64 {
    if records.is_empty() {
        0.0
    } else {
        records.iter().map(|r| r.trajectory.reward).sum::<f64>() / records.len() as f64
    }
}

fn forest_summary(
    i: usize,
    sample: &QaSample,
    forest: &Forest,
    records: &[TrajectoryRecord],
) -> ForestSummary {
    ForestSummary {
        prompt_index: i,
        prompt_uid: sample.id.to_string(),
        trees: forest.trees.len(),
        rollouts: records.len(),
        mean_reward: mean_reward(records),
        tokens: TokenSummary::from_cost(&forest.cost),
        tool_calls: forest.cost.tool_calls,
        skipped_branches: forest.cost.skipped_branches,
        failed_branches: forest.failed.clone(),
        wall_seconds: forest.wall_seconds,
    }
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    ctx: &SamplerContext,
    shared_prefix: TokenSummary,
    forests: Vec<ForestSummary>,
    records: &[TrajectoryRecord],
    trees: &[Tree],
    prompts: usize,
    after: &EngineCounters,
    start: &EngineStats,
    wall_seconds: f64,
    options: &RunOptions,
    interrupted: bool,
) -> RunSummary {
    let mut tokens = shared_prefix;
    for f in &forests {
        tokens.add(&f.tokens);
    }
    let rollouts = records.len();
    RunSummary {
        prompts,
        prompts_finished: forests.len(),
        rollouts,
        mean_reward: mean_reward(records),
        tokens,
        tokens_computed_per_rollout: if rollouts == 0 {
            0.0
        } else {
            tokens.computed as f64 / rollouts as f64
        },
        computed_tokens_per_second: tokens.computed as f64 / wall_seconds.max(1e-9),
        tool_calls: forests.iter().map(|f| f.tool_calls).sum(),
        failed_branches: forests.iter().map(|f| f.failed_branches.len()).sum(),
        wall_seconds,
        peak_kv_bytes: after.peak_kv_bytes,
        kv_pool_bytes: (start.kv.num_blocks * start.kv.bytes_per_block) as u64,
        weight_version: start.weight_version,
        precision: start.precision,
        config: ctx.config.clone(),
        advantage: options.advantage,
        token_budget: options.token_budget,
        budget_exhausted: ctx.budget_spent.load(Ordering::Relaxed),
        interrupted,
        shared_prefix,
        forests,
        branching: BranchingStats::of_trees(records, trees),
    }
}
