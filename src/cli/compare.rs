//! `treegrpo compare`: the learning comparison — one warm-start shared by every arm,
//! each arm × seed a training run at the same computed-token budget per step, greedy
//! evaluations at token intervals, then `summary.json`, `eval.svg` and `report.md`.
//! Rerun the same command to continue an interrupted comparison.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::Args;
use treegrpo::closed_loop::StopSignal;
use treegrpo::compare::{
    parse_arms, run_compare, CompareEvent, CompareOutcome, ComparePlan, Summary, PLOT_FILE,
    REPORT_FILE, SUMMARY_FILE,
};
use treegrpo::env::Split;

use super::flags::{TaskFlags, UpdateFlags};
use super::progress::Progress;
use super::sft::WarmStartView;
use super::train::TrainView;

#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub source: TaskFlags,
    /// Arms, comma-separated: tree[-inter|-intra|-2norm][-M-N-L] or chain[-G]
    /// (`tree` is (2,2,1) with intra + inter advantages, `chain` 4 chains with GRPO),
    /// a trailing -entropy to expand the most uncertain boundaries, -b<spec> (or
    /// -treerl) to draw each branch's first tokens wider (the spec of `rollout
    /// --branch-sampling`, e.g. tree-bt2, tree-treerl), then -mask to leave those
    /// tokens out of the loss instead of importance-weighting them.
    #[arg(
        long,
        default_value = "tree,chain,tree-inter,tree-intra,tree-2-4-1,tree-entropy"
    )]
    pub arms: String,
    /// Seeds of the arms in --full-seed-arms (the others run one).
    #[arg(long, default_value_t = 3)]
    pub seeds: usize,
    /// Arms that run every seed, comma-separated.
    #[arg(long, default_value = "tree,chain")]
    pub full_seed_arms: String,
    /// The first rollout seed (seed k of an arm uses seed + k).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Training steps of every run (a rerun with more extends a finished comparison).
    #[arg(long, default_value_t = 6)]
    pub steps: u64,
    /// Prompts of each step, the same for every arm.
    #[arg(long, default_value_t = 8)]
    pub prompts_per_step: usize,
    /// Computed tokens each step's rollouts spend, for every arm: each arm adds trees
    /// (chains) to the step's prompts until it is spent.
    #[arg(long, default_value_t = 16_000)]
    pub token_budget: u64,
    /// Evaluate whenever a run's cumulative computed tokens cross a multiple of this
    /// (and after the last step); default: twice --token-budget.
    #[arg(long)]
    pub eval_every_tokens: Option<u64>,
    /// Test questions per evaluation (default: the whole test split).
    #[arg(long)]
    pub eval_prompts: Option<usize>,
    /// Training questions the shared warm-start demonstrates (0: none); the default
    /// (64, 2 epochs) takes the default model to a greedy eval of 0.67 on search-qa,
    /// so sampled rollouts earn reward and groups have mixed rewards.
    #[arg(long, default_value_t = 64)]
    pub warm_start: usize,
    #[arg(long, default_value_t = 2)]
    pub warm_start_epochs: usize,
    #[arg(long, default_value_t = 1e-4)]
    pub warm_start_lr: f64,
    /// Sampling temperature of every arm.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Most tokens per agent step.
    #[arg(long, default_value_t = 96)]
    pub max_step_tokens: usize,
    /// Tool turns before the forced answer turn.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    #[command(flatten)]
    pub update: UpdateFlags,
    /// Most prompts grown at once (0: all).
    #[arg(long, default_value_t = 16)]
    pub concurrent_prompts: usize,
    /// KV cache budget in MiB (default: a quarter of the available memory).
    #[arg(long)]
    pub kv_mib: Option<usize>,
    /// The comparison's folder (rerun with the same flags to continue it).
    #[arg(long)]
    pub out: PathBuf,
}

/// The plan the flags describe, checked before anything loads.
fn plan(a: &CompareArgs) -> anyhow::Result<ComparePlan> {
    a.update.check()?;
    let test = a
        .source
        .task
        .split(&a.source.data(), Split::Test, usize::MAX)?
        .len();
    let plan = ComparePlan {
        task: a.source.task,
        model: a.source.model.clone(),
        data: a.source.data.clone(),
        arms: parse_arms(&a.arms)?,
        seeds: a.seeds,
        full_seed_arms: a
            .full_seed_arms
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        seed: a.seed,
        steps: a.steps,
        prompts_per_step: a.prompts_per_step,
        step_budget: a.token_budget,
        eval_every_tokens: a.eval_every_tokens.unwrap_or(2 * a.token_budget),
        eval_prompts: a.eval_prompts.unwrap_or(test).min(test),
        warm_start: a.warm_start,
        warm_start_epochs: a.warm_start_epochs,
        warm_start_lr: a.warm_start_lr,
        temperature: a.temperature,
        max_step_tokens: a.max_step_tokens,
        turns: a.turns,
        update: a.update.update_config(f64::from(a.temperature)),
        optimizer: a.update.optimizer_config(),
        concurrent_prompts: a.concurrent_prompts,
    };
    plan.check()?;
    Ok(plan)
}

pub fn run(a: CompareArgs) -> anyhow::Result<()> {
    let plan = plan(&a)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let stop = Arc::new(StopSignal::default());
    let signal = stop.clone();
    let (first, second) = (
        super::interrupt::next_sigint(),
        super::interrupt::nth_sigint(2),
    );
    rt.spawn(async move {
        first.await;
        eprintln!("interrupted: stopping at the next safe point (Ctrl-C again to quit now)");
        signal.raise();
        second.await;
        std::process::exit(130);
    });
    let view = Arc::new(Mutex::new(CompareView::new(&plan)));
    let shown = view.clone();
    let on_event = Box::new(move |e: CompareEvent<'_>| {
        shown.lock().unwrap_or_else(|p| p.into_inner()).show(e)
    });
    let kv = super::flags::kv_budget_bytes(a.kv_mib);
    let outcome = rt.block_on(run_compare(&plan, &a.out, kv, stop, on_event));
    view.lock().unwrap_or_else(|p| p.into_inner()).finish();
    match outcome? {
        CompareOutcome::Finished(summary) => {
            print_table(&summary);
            eprintln!(
                "wrote {0}/{SUMMARY_FILE}, {0}/{PLOT_FILE}, {0}/{REPORT_FILE}",
                a.out.display()
            );
            Ok(())
        }
        CompareOutcome::Interrupted => {
            eprintln!(
                "interrupted; rerun the same command to continue ({} keeps every finished step)",
                a.out.display()
            );
            std::process::exit(130);
        }
    }
}

/// The final table on stdout.
fn print_table(s: &Summary) {
    println!(
        "{}: final greedy eval on {} questions (start {:.3}), {} steps at {} tokens each",
        s.task, s.eval_questions, s.start_eval, s.steps, s.step_budget
    );
    for (name, a) in &s.arms {
        println!(
            "  {name:<20} {:.3} ± {:.3}  ({} seeds, {:.0} tokens computed)",
            a.final_eval_mean,
            a.final_eval_std,
            a.seeds.len(),
            a.computed_tokens.iter().sum::<u64>() as f64 / a.computed_tokens.len().max(1) as f64
        );
        if let (Some(d), Some(chain)) = (&a.vs_chain, &s.chain_arm) {
            println!(
                "  {:<20} vs {chain}: {:+.3} [{:+.3}, {:+.3}] (95%, {} seeds × {} questions paired){}",
                "",
                d.mean_diff,
                d.ci_low,
                d.ci_high,
                d.seeds_paired,
                d.questions,
                if d.beats_chain { ": beats it" } else { "" }
            );
        }
    }
}

/// The comparison's progress: a bar over its runs, the run in progress's train
/// display under it, the warm-start's before.
struct CompareView {
    runs: Progress,
    warm: WarmStartView,
    run: Option<TrainView>,
    steps: u64,
    prompts: u64,
    /// Runs finished (before this process too).
    done: u64,
}

impl CompareView {
    fn new(plan: &ComparePlan) -> Self {
        let runs = Progress::new("compare", "runs", plan.runs().len() as u64);
        CompareView {
            warm: WarmStartView::new("warm-start", plan.warm_start),
            runs,
            run: None,
            steps: plan.steps,
            prompts: plan.prompts_per_step as u64,
            done: 0,
        }
    }

    fn show(&mut self, e: CompareEvent<'_>) {
        match e {
            CompareEvent::WarmStart(e) => self.warm.show(e),
            CompareEvent::EvaluatingStart => {
                self.runs.status("compare", "evaluating the start weights")
            }
            CompareEvent::WarmStartReused { eval_reward } => self.runs.println(format!(
                "reusing the folder's warm-start (eval {})",
                eval_reward.map_or_else(|| "–".into(), |r| format!("{r:.3}"))
            )),
            CompareEvent::RunDone { arm, seed } => {
                self.runs
                    .println(format!("{arm} seed {seed}: already finished"));
                self.done += 1;
                self.runs.update(self.done, String::new());
            }
            CompareEvent::RunStarting {
                arm,
                seed,
                index,
                total,
                resumed_after,
            } => {
                if let Some(run) = self.run.take() {
                    run.finish();
                }
                let how = if resumed_after > 0 {
                    format!(" (resumed after step {resumed_after})")
                } else {
                    String::new()
                };
                self.runs
                    .println(format!("run {}/{total}: {arm} seed {seed}{how}", index + 1));
                self.done = index as u64;
                self.runs.update(self.done, format!("{arm} seed {seed}"));
                self.run = Some(TrainView::named(
                    arm,
                    self.steps,
                    self.prompts,
                    resumed_after,
                ));
            }
            CompareEvent::Loop(e) => {
                if let Some(run) = &mut self.run {
                    run.show(e);
                }
            }
        }
    }

    fn finish(&mut self) {
        if let Some(run) = self.run.take() {
            run.finish();
        }
        self.runs.finish();
    }
}
