//! A whole rollout run: every prompt's forest grown concurrently on one engine, scored,
//! and written out as soon as it (and every prompt before it) is finished, so an
//! interrupted run keeps every finished tree and the same seed always writes the same
//! bytes whatever finishes first.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tokio::task::JoinSet;

use crate::advantage::AdvantageMode;
use crate::engine::{Engine, EngineCounters};
use crate::env::{Environment, QaSample};

use super::error::RolloutError;
use super::export::{score_forest, TrajectoryRecord};
use super::forest::Tree;
use super::sampler::{sample_prompt_forest, SamplerContext, SamplerTally, TreeConfig};

/// Token figures of a run, from the engine's counters and the sampler's bookkeeping.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TokenSummary {
    /// Prompt tokens computed (each prompt once with prefix reuse).
    pub prompt_prefilled: u64,
    /// Observation tokens computed.
    pub observation_prefilled: u64,
    /// Sampled tokens fed back through the model.
    pub decoded: u64,
    /// Tokens needed but not computed (forks and the prefix cache).
    pub reused: u64,
    /// Of `reused`: prompt tokens found in the prefix cache (prompts sharing a
    /// system prompt prefill it once).
    pub reused_prefix_cache: u64,
    /// Tokens computed again because a prefix was re-sent (`prefix_reuse` off).
    pub recomputed: u64,
    /// Everything the model computed.
    pub computed: u64,
}

/// `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub prompts: usize,
    pub rollouts: usize,
    pub mean_reward: f64,
    pub tokens: TokenSummary,
    pub tokens_computed_per_rollout: f64,
    pub tool_calls: u64,
    pub wall_seconds: f64,
    pub peak_kv_bytes: u64,
    pub config: TreeConfig,
    pub advantage: AdvantageMode,
}

/// Progress after each finished prompt.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub prompts_done: usize,
    pub prompts: usize,
    pub rollouts: usize,
    pub computed_tokens: u64,
    pub seconds: f64,
}

/// Where and how to write results.
pub struct Output {
    dir: PathBuf,
    trajectories: std::fs::File,
    forest: std::fs::File,
}

impl Output {
    pub fn create(dir: &Path) -> Result<Self, RolloutError> {
        let io = |e: std::io::Error| RolloutError::Io(dir.to_path_buf(), e);
        std::fs::create_dir_all(dir).map_err(io)?;
        let trajectories = std::fs::File::create(dir.join("trajectories.jsonl")).map_err(io)?;
        let forest = std::fs::File::create(dir.join("forest.jsonl")).map_err(io)?;
        Ok(Output {
            dir: dir.to_path_buf(),
            trajectories,
            forest,
        })
    }

    fn write(&mut self, records: &[TrajectoryRecord], trees: &[Tree]) -> Result<(), RolloutError> {
        let io = |e: std::io::Error| RolloutError::Io(self.dir.clone(), e);
        let mut buf = Vec::new();
        for r in records {
            serde_json::to_writer(&mut buf, r).map_err(|e| io(e.into()))?;
            buf.push(b'\n');
        }
        // One write per prompt, then flush: a line is either whole or absent.
        self.trajectories.write_all(&buf).map_err(io)?;
        self.trajectories.flush().map_err(io)?;
        let mut buf = Vec::new();
        for t in trees {
            serde_json::to_writer(&mut buf, t).map_err(|e| io(e.into()))?;
            buf.push(b'\n');
        }
        self.forest.write_all(&buf).map_err(io)?;
        self.forest.flush().map_err(io)?;
        Ok(())
    }

    fn write_summary(&self, summary: &RunSummary) -> Result<(), RolloutError> {
        let path = self.dir.join("summary.json");
        let text = serde_json::to_string_pretty(summary)
            .map_err(|e| RolloutError::Io(path.clone(), e.into()))?;
        std::fs::write(&path, text + "\n").map_err(|e| RolloutError::Io(path, e))
    }
}

/// Runs every sample's forest and returns the summary (and writes `out` if given).
pub async fn run_rollout(
    engine: Engine,
    env: Arc<dyn Environment>,
    samples: Vec<QaSample>,
    config: TreeConfig,
    advantage: AdvantageMode,
    mut out: Option<Output>,
    progress: &mut dyn FnMut(Progress),
) -> Result<(RunSummary, Vec<TrajectoryRecord>), RolloutError> {
    let t0 = Instant::now();
    let before = engine.stats().await?.counters;
    let ctx = Arc::new(SamplerContext {
        engine: engine.clone(),
        env,
        config: config.clone(),
        tally: SamplerTally::default(),
    });
    let mut jobs = JoinSet::new();
    for (i, sample) in samples.iter().cloned().enumerate() {
        let ctx = ctx.clone();
        jobs.spawn(async move {
            let prompt_ids = ctx
                .engine
                .model()
                .chat_prompt(ctx.env.start(&sample).prompt());
            let trees = sample_prompt_forest(ctx, i as u64, sample).await;
            (i, prompt_ids, trees)
        });
    }
    let n = samples.len();
    let mut ready: BTreeMap<usize, (Vec<TrajectoryRecord>, Vec<Tree>)> = BTreeMap::new();
    let mut next_to_write = 0;
    let mut all = Vec::new();
    let mut done = 0;
    while let Some(joined) = jobs.join_next().await {
        let (i, prompt_ids, trees) = joined.map_err(|e| RolloutError::Task(e.to_string()))?;
        let (prompt_ids, mut trees) = (prompt_ids?, trees?);
        let records = score_forest(&prompt_ids, &mut trees, advantage)?;
        ready.insert(i, (records, trees));
        // Write in prompt order: the file's bytes do not depend on finishing order.
        while let Some((records, trees)) = ready.remove(&next_to_write) {
            if let Some(o) = out.as_mut() {
                o.write(&records, &trees)?;
            }
            all.extend(records);
            next_to_write += 1;
        }
        done += 1;
        let c = engine.stats().await?.counters;
        progress(Progress {
            prompts_done: done,
            prompts: n,
            rollouts: all.len() + ready.values().map(|(r, _)| r.len()).sum::<usize>(),
            computed_tokens: c.computed() - before.computed(),
            seconds: t0.elapsed().as_secs_f64(),
        });
    }
    let after = engine.stats().await?.counters;
    let summary = summarize(
        &ctx,
        &before,
        &after,
        &all,
        n,
        t0.elapsed().as_secs_f64(),
        advantage,
    );
    if let Some(o) = out.as_ref() {
        o.write_summary(&summary)?;
    }
    Ok((summary, all))
}

fn summarize(
    ctx: &SamplerContext,
    before: &EngineCounters,
    after: &EngineCounters,
    records: &[TrajectoryRecord],
    prompts: usize,
    wall_seconds: f64,
    advantage: AdvantageMode,
) -> RunSummary {
    let prefilled = after.prefilled - before.prefilled;
    let decoded = after.decoded - before.decoded;
    let observation = ctx.tally.observation_tokens.load(Ordering::Relaxed);
    let recomputed = ctx.tally.recomputed.load(Ordering::Relaxed);
    let computed = prefilled + decoded;
    let rollouts = records.len();
    RunSummary {
        prompts,
        rollouts,
        mean_reward: if rollouts == 0 {
            0.0
        } else {
            records.iter().map(|r| r.trajectory.reward).sum::<f64>() / rollouts as f64
        },
        tokens: TokenSummary {
            prompt_prefilled: prefilled.saturating_sub(observation + recomputed),
            observation_prefilled: observation,
            decoded,
            reused: after.reused() - before.reused(),
            reused_prefix_cache: after.reused_prefix_cache - before.reused_prefix_cache,
            recomputed,
            computed,
        },
        tokens_computed_per_rollout: if rollouts == 0 {
            0.0
        } else {
            computed as f64 / rollouts as f64
        },
        tool_calls: ctx.tally.tool_calls.load(Ordering::Relaxed),
        wall_seconds,
        peak_kv_bytes: after.peak_kv_bytes,
        config: ctx.config.clone(),
        advantage,
    }
}
