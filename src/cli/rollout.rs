//! `treegrpo rollout`: tree (or chain) rollouts on a built-in task, written for trainers.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use treegrpo::advantage::AdvantageMode;
use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::rollout::{
    run_rollout, Interrupt, Output, RolloutRequest, RunHooks, RunOptions, RunSummary, TreeConfig,
};

use super::progress::Progress;

#[derive(Debug, Args)]
pub struct RolloutArgs {
    #[command(flatten)]
    pub source: super::flags::TaskFlags,
    #[command(flatten)]
    pub precision: super::flags::PrecisionFlag,
    /// Number of prompts (questions) to roll out.
    #[arg(long, default_value_t = 8)]
    pub prompts: usize,
    #[command(flatten)]
    pub tree: super::flags::TreeFlags,
    /// Re-send and recompute every branch's whole prefix, as the reference does.
    #[arg(long)]
    pub no_prefix_reuse: bool,
    /// Advantage: tree, tree-2norm, inter, intra or grpo.
    #[arg(long)]
    pub advantage: Option<AdvantageMode>,
    /// Most sequences per forward (results do not depend on it).
    #[arg(long, default_value_t = 64)]
    pub max_batch_seqs: usize,
    /// KV cache budget in MiB (default: a quarter of the available memory, between
    /// 512 MiB and 8 GiB). A smaller pool is slower, never wrong: sequences that do
    /// not fit at once are preempted and recomputed.
    #[arg(long)]
    pub kv_mib: Option<usize>,
    /// Stop starting new branches (and prompts) once this many tokens were computed;
    /// branches already running finish, so the run may overrun it by a few branches.
    #[arg(long)]
    pub token_budget: Option<u64>,
    /// Most prompts grown at once (0: all).
    #[arg(long, default_value_t = 16)]
    pub concurrent_prompts: usize,
    /// Output folder (trajectories.jsonl, forest.jsonl, summary.json).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl RolloutArgs {
    pub fn tree_config(&self) -> Result<TreeConfig, treegrpo::rollout::TreeConfigError> {
        let mut cfg = self.tree.tree_config()?;
        cfg.prefix_reuse = !self.no_prefix_reuse;
        Ok(cfg)
    }
}

/// Builds the environment and samples, then runs on `engine`.
pub async fn execute(
    a: &RolloutArgs,
    engine: Engine,
    cfg: TreeConfig,
    out: Option<Output>,
    interrupt: Option<Interrupt>,
) -> anyhow::Result<RunSummary> {
    let data = a.source.data();
    let (env, samples) = a.source.task.setup(&data, a.tree.step.turns, a.prompts)?;
    let advantage = a.advantage.unwrap_or(cfg.default_advantage());
    let bar = Progress::new("rollout", "prompts", samples.len() as u64);
    let shown = bar.clone();
    let progress = move |p: treegrpo::rollout::Progress| {
        shown.update(p.prompts_done as u64, rollout_message(&p));
    };
    let options = RunOptions {
        advantage,
        token_budget: a.token_budget,
        max_concurrent_prompts: a.concurrent_prompts,
        prompt_offset: 0,
    };
    let request = RolloutRequest {
        env,
        samples,
        config: cfg,
        options,
    };
    let hooks = RunHooks {
        output: out,
        progress: Some(Box::new(progress)),
        interrupt,
    };
    let summary = run_rollout(engine, request, hooks).await?.summary;
    // Only a run that ended (an interrupted one too) has a last state worth a line.
    bar.finish();
    Ok(summary)
}

/// What a rollout's bar shows beside its prompts (bench's rows show the same).
pub(crate) fn rollout_message(p: &treegrpo::rollout::Progress) -> String {
    format!(
        "{} rollouts, {} tokens computed, {:.0} tok/s",
        p.rollouts,
        p.computed_tokens,
        p.computed_tokens as f64 / p.seconds.max(1e-9)
    )
}

pub fn run(a: RolloutArgs) -> anyhow::Result<()> {
    let cfg = a.tree_config()?;
    anyhow::ensure!(a.prompts > 0, "--prompts must be at least 1");
    let model = Arc::new(
        a.precision
            .apply(super::load_model(a.source.model.as_deref())?)?,
    );
    let engine = Engine::start(
        model,
        EngineConfig {
            kv_budget_bytes: super::flags::kv_budget_bytes(a.kv_mib),
            max_batch_seqs: a.max_batch_seqs,
            prefix_cache: !a.no_prefix_reuse,
            // A finished tree's blocks are not looked up again.
            reuse_cached_first: true,
            ..EngineConfig::default()
        },
    )?;
    let out = a.out.as_deref().map(Output::create).transpose()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // Ctrl-C: stop, keep every finished tree, write the summary, exit 130.
    let interrupt: Interrupt = super::interrupt::next_sigint();
    let summary = rt.block_on(execute(&a, engine, cfg, out, Some(interrupt)))?;
    print_summary(&summary);
    if summary.interrupted {
        eprintln!(
            "interrupted: {} of {} prompts finished and written",
            summary.prompts_finished, summary.prompts
        );
    }
    if summary.failed_branches > 0 {
        eprintln!(
            "{} branches failed (listed per prompt in summary.json): {}",
            summary.failed_branches,
            summary
                .forests
                .iter()
                .flat_map(|f| &f.failed_branches)
                .map(|b| b.error.as_str())
                .next()
                .unwrap_or_default()
        );
    }
    if summary.budget_exhausted {
        eprintln!(
            "token budget {} reached: later branches were not started",
            summary.token_budget.unwrap_or(0)
        );
    }
    if let Some(dir) = &a.out {
        println!(
            "wrote {}/trajectories.jsonl, forest.jsonl, summary.json",
            dir.display()
        );
    }
    if summary.interrupted {
        // The conventional status of a program stopped by SIGINT.
        std::process::exit(130);
    }
    Ok(())
}

pub fn print_summary(s: &RunSummary) {
    let t = &s.tokens;
    println!("| prompts | rollouts | mean reward | prompt prefilled | obs prefilled | decoded | reused | recomputed | preemptions (tokens recomputed) | computed / rollout | tool calls | wall s | computed tok/s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {:.3} | {} | {} | {} | {} | {} | {} ({}) | {:.1} | {} | {:.1} | {:.0} |",
        s.prompts,
        s.rollouts,
        s.mean_reward,
        t.prompt_prefilled,
        t.observation_prefilled,
        t.decoded,
        t.reused,
        t.recomputed,
        t.preemptions,
        t.recomputed_preempted,
        s.tokens_computed_per_rollout,
        s.tool_calls,
        s.wall_seconds,
        s.computed_tokens_per_second
    );
}
