//! `treegrpo train`: the closed loop — rollouts from the policy the engine serves,
//! advantages, one update, the new weights swapped into the engine, step after step;
//! `log.jsonl`, checkpoints, `--resume`, and `reward.svg` at the end.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use clap::Args;
use treegrpo::advantage::AdvantageMode;
use treegrpo::closed_loop::{
    prepare_fresh_folder, run_warm_start, BoostedTokens, LoopConfig, LoopEvent, LoopOutcome,
    RunSource, RunStart, SftConfig, StepLog, StopSignal, TrainRun, WarmStartConfig,
    WarmStartInputs,
};
use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::env::{Environment, QaSample, Split};
use treegrpo::model::kernels::WeightFormat;
use treegrpo::model::LoadedModel;
use treegrpo::train::{KlReference, Optimizer, Params};

use super::flags::{TaskFlags, TreeFlags, UpdateFlags};
use super::progress::Progress;

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// `--model` may be a `treegrpo sft` checkpoint; a resumed run takes the model
    /// its run.json names unless `--model` is given.
    #[command(flatten)]
    pub source: TaskFlags,
    #[arg(long, default_value_t = LoopConfig::default().steps)]
    pub steps: u64,
    #[arg(long, default_value_t = LoopConfig::default().prompts_per_step)]
    pub prompts_per_step: usize,
    #[command(flatten)]
    pub tree: TreeFlags,
    /// Advantage: tree, tree-2norm, inter, intra or grpo (default: tree for trees,
    /// grpo for chains).
    #[arg(long)]
    pub advantage: Option<AdvantageMode>,
    #[command(flatten)]
    pub update: UpdateFlags,
    /// What the update does with tokens drawn from `--branch-sampling`'s boost:
    /// corrected (importance-weighted against the distribution they were drawn
    /// from, capped at --tis-cap) or masked (left out of the loss).
    #[arg(long, default_value = "corrected")]
    pub boosted_tokens: BoostedTokens,
    /// Warm-start first: supervised steps on the oracle's demonstrations of the first N
    /// training questions (0: none), so the policy writes the step format RL needs.
    #[arg(long, default_value_t = 0)]
    pub warm_start: usize,
    #[arg(long, default_value_t = 1)]
    pub warm_start_epochs: usize,
    /// AdamW learning rate of the warm-start.
    #[arg(long, default_value_t = 1e-4)]
    pub warm_start_lr: f64,
    /// Evaluate (greedy, test split) every K steps; always before the first and after
    /// the last.
    #[arg(long, default_value_t = LoopConfig::default().eval_every)]
    pub eval_every: u64,
    /// Test questions per evaluation (0: no evaluation).
    #[arg(long, default_value_t = LoopConfig::default().eval_prompts)]
    pub eval_prompts: usize,
    /// Checkpoint every K steps (always after the last).
    #[arg(long, default_value_t = LoopConfig::default().checkpoint_every)]
    pub checkpoint_every: u64,
    /// How the engine holds the trained weights: f32 (exactly the trainer's values)
    /// or bf16 (rounded: half the bytes a decode step reads).
    #[arg(long, default_value = "f32", value_parser = treegrpo::train::serving::served_format)]
    pub serve: WeightFormat,
    /// The KL term's reference (`--kl-coef`): previous or start. A resumed run keeps
    /// the one it was started with.
    #[arg(long, default_value = "previous")]
    pub kl_reference: KlReference,
    /// KV cache budget in MiB (default: a quarter of the available memory).
    #[arg(long)]
    pub kv_mib: Option<usize>,
    /// Most prompts grown at once (0: all).
    #[arg(long, default_value_t = LoopConfig::default().concurrent_prompts)]
    pub concurrent_prompts: usize,
    /// Continue the run in DIR from its last checkpoint, with the flags it was started
    /// with (its log from there equals an uninterrupted run's); the model (unless
    /// `--model` names another), the warm-start size and the KL reference come from
    /// DIR/run.json.
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    pub resume: Option<PathBuf>,
    /// Run folder: log.jsonl, checkpoint/, run.json, reward.svg. A folder that holds
    /// a run already is refused (its history is kept): `--resume` continues it,
    /// `--overwrite` starts over.
    #[arg(long, required_unless_present_any = ["resume", "print_config"])]
    pub out: Option<PathBuf>,
    /// Print the run's settings as the flags resolve them (JSON) and exit, without
    /// loading or writing anything.
    #[arg(long)]
    pub print_config: bool,
    /// With `--out`: replace the run already in the folder (its log, checkpoints and
    /// reference weights are deleted as the new run starts).
    #[arg(long, conflicts_with = "resume")]
    pub overwrite: bool,
}

/// What the run works on: the model, the engine serving it, the task's questions.
struct Loaded {
    model: Arc<LoadedModel>,
    model_path: PathBuf,
    engine: Engine,
    env: Arc<dyn Environment>,
    /// The warm-start's questions (empty unless it runs now) and the RL prompts.
    demos: Vec<QaSample>,
    train: Vec<QaSample>,
    test: Vec<QaSample>,
}

pub fn run(a: TrainArgs) -> anyhow::Result<()> {
    let config = loop_config(&a)?;
    if a.print_config {
        println!("{}", serde_json::to_string_pretty(&config)?);
        return Ok(());
    }
    let start = match &a.resume {
        Some(dir) => RunStart::resume(dir, a.source.model.clone())?,
        None => RunStart::fresh(a.source.model.clone(), a.warm_start),
    };
    let out = a
        .resume
        .clone()
        .or(a.out.clone())
        .ok_or_else(|| anyhow::anyhow!("--out or --resume is required"))?;
    if start.resumed.is_none() {
        // Before the model loads and the warm-start runs: a refused folder costs
        // nothing.
        prepare_fresh_folder(&out, a.overwrite)?;
    }
    let loaded = load(&a, &start)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let run = prepare(&a, &rt, &start, loaded, config, out.clone())?;
    let outcome = drive(&rt, run)?;
    finish(&out, outcome)
}

/// The loop's settings from the flags, checked before anything is loaded.
fn loop_config(a: &TrainArgs) -> anyhow::Result<LoopConfig> {
    a.update.check()?;
    let tree = a.tree.tree_config()?;
    let update = a.update.update_config(tree.sampling.logprob_temperature());
    let base = LoopConfig::new(tree, update);
    let config = LoopConfig {
        boosted_tokens: a.boosted_tokens,
        steps: a.steps,
        prompts_per_step: a.prompts_per_step,
        advantage: a.advantage.unwrap_or(base.advantage),
        concurrent_prompts: a.concurrent_prompts,
        eval_every: a.eval_every,
        eval_prompts: a.eval_prompts,
        checkpoint_every: a.checkpoint_every,
        serve_format: a.serve,
        // A resumed run takes the one its run.json records (`TrainRun::resume`).
        kl_reference: a.kl_reference,
        ..base
    };
    config
        .check()
        .map_err(|e| anyhow::anyhow!("--{}: {e}", e.field().replace('_', "-")))?;
    Ok(config)
}

/// Loads the model `start` names, starts the engine on it, and reads the task's data.
fn load(a: &TrainArgs, start: &RunStart) -> anyhow::Result<Loaded> {
    let model_path =
        treegrpo::model::fetch::model_path_or_default(start.model.as_deref(), &mut |m| {
            eprintln!("{m}")
        })?;
    let model = Arc::new(LoadedModel::load(&model_path)?);
    let data = a.source.data();
    let (env, train) = a.source.task.setup(&data, a.tree.step.turns, usize::MAX)?;
    let (demos, train) = start.split_train(train);
    let test = a.source.task.split(&data, Split::Test, a.eval_prompts)?;
    let engine = Engine::start(
        model.clone(),
        EngineConfig {
            kv_budget_bytes: super::flags::kv_budget_bytes(a.kv_mib),
            // Each step's trees are new prompts (and a swap clears the cache).
            reuse_cached_first: true,
            ..EngineConfig::default()
        },
    )?;
    Ok(Loaded {
        model,
        model_path,
        engine,
        env,
        demos,
        train,
        test,
    })
}

/// The run, ready to step: warm-started and fresh, or resumed from its checkpoint.
fn prepare(
    a: &TrainArgs,
    rt: &tokio::runtime::Runtime,
    start: &RunStart,
    l: Loaded,
    config: LoopConfig,
    out: PathBuf,
) -> anyhow::Result<TrainRun> {
    eprintln!("preparing f32 trainer weights");
    let params = Params::trainable(&l.model.model)?;
    let warm = if start.warm_starts_now() {
        let cfg = WarmStartConfig {
            task: Some(a.source.task),
            lr: a.warm_start_lr,
            sft: SftConfig {
                epochs: a.warm_start_epochs,
                seed: a.tree.step.seed,
                ..SftConfig::default()
            },
            max_step_tokens: a.tree.step.max_step_tokens,
            evaluate_after: false,
            serve_format: config.serve_format,
        };
        let inputs = WarmStartInputs {
            model: &l.model,
            engine: Some(&l.engine),
            env: &l.env,
            demos: &l.demos,
            test: &l.test,
            params: &params,
        };
        let mut view = super::sft::WarmStartView::new("warm-start", l.demos.len());
        let warm = rt.block_on(run_warm_start(inputs, &cfg, &mut |e| view.show(e)))?;
        warm.write_to_run(&out)?;
        Some(warm)
    } else {
        None
    };
    let source = RunSource {
        model: l.model_path,
        task: Some(a.source.task),
        warm_start: start.warm_start,
    };
    let optimizer = Optimizer::new(a.update.optimizer_config());
    let run = TrainRun::new(
        l.engine, l.model, l.env, l.train, l.test, params, optimizer, config, out,
    )?
    .with_source(source)
    .overwriting(a.overwrite);
    if let Some(served) = warm.and_then(|w| w.served) {
        run.set_served(served);
    }
    if start.resumed.is_none() {
        return Ok(run);
    }
    let run = rt.block_on(run.resume())?;
    eprintln!("resuming after step {}", run.state.step);
    Ok(run)
}

/// Runs the steps, Ctrl-C stopping at the next safe point, the loop's events on
/// stderr and each step's line on stdout.
fn drive(rt: &tokio::runtime::Runtime, mut run: TrainRun) -> anyhow::Result<LoopOutcome> {
    let stop = Arc::new(StopSignal::default());
    let signal = stop.clone();
    let (steps, prompts) = (run.config.steps, run.config.prompts_per_step as u64);
    let view = Arc::new(Mutex::new(TrainView::new(steps, prompts, run.state.step)));
    let shown = view.clone();
    let bar = lock(&view).steps.clone();
    let (first, second) = (
        super::interrupt::next_sigint(),
        super::interrupt::nth_sigint(2),
    );
    rt.spawn(async move {
        // First Ctrl-C: stop at the next safe point (the step in progress is dropped;
        // log and checkpoint stay whole). Second: leave at once (both are still whole).
        first.await;
        bar.println("interrupted: stopping (Ctrl-C again to quit now)");
        signal.raise();
        second.await;
        std::process::exit(130);
    });
    let on_event = Box::new(move |e: LoopEvent<'_>| lock(&shown).show(e));
    let outcome = rt.block_on(run.run(stop, on_event));
    lock(&view).finish();
    Ok(outcome?)
}

/// The reward plot, where the files are, and status 130 after an interrupt.
fn finish(out: &Path, outcome: LoopOutcome) -> anyhow::Result<()> {
    let svg = out.join("reward.svg");
    super::plot::write_plot(&[out.to_path_buf()], &svg)?;
    eprintln!(
        "wrote {}/log.jsonl, checkpoint/, {}",
        out.display(),
        svg.display()
    );
    if let LoopOutcome::Interrupted { completed } = outcome {
        eprintln!(
            "interrupted after step {completed}; continue with --resume {}",
            out.display()
        );
        std::process::exit(130);
    }
    Ok(())
}

/// The loop's events: a bar over the run's steps and, under it, one over the phase
/// of the step in progress (its rollout's prompts, its update's tokens, an
/// evaluation); each finished step's line on stdout. A phase's bar starts when the
/// one before it ends (the loop reports only what is done), so its rate and ETA
/// count its whole time.
pub(crate) struct TrainView {
    steps: Progress,
    phase: Progress,
    /// The step and phase the phase bar shows.
    showing: Option<(u64, Phase)>,
    last_step: u64,
    prompts_per_step: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A wave of the step's rollouts (1-based; a budgeted step may run several).
    Rollout(usize),
    Update,
}

impl TrainView {
    /// Made just before the loop runs: `done` of the run's `steps` were before this
    /// process (a resumed run), and the next one's rollout of `prompts` starts now.
    pub(crate) fn new(steps: u64, prompts: u64, done: u64) -> Self {
        Self::named("train", steps, prompts, done)
    }

    /// The same with its bar named `prefix`.
    pub(crate) fn named(prefix: &str, steps: u64, prompts: u64, done: u64) -> Self {
        let bar = Progress::new(prefix, "steps", steps);
        bar.start_at(done);
        let phase = bar.below(&format!("step {} rollout", done + 1), "prompts", prompts);
        TrainView {
            steps: bar,
            phase,
            showing: Some((done + 1, Phase::Rollout(1))),
            last_step: steps,
            prompts_per_step: prompts,
        }
    }

    /// Shows `phase` of `step` from now (unless it does already).
    fn start(&mut self, step: u64, phase: Phase) {
        if self.showing == Some((step, phase)) {
            return;
        }
        self.showing = Some((step, phase));
        match phase {
            Phase::Rollout(1) => self.phase.restart(
                &format!("step {step} rollout"),
                "prompts",
                self.prompts_per_step,
            ),
            Phase::Rollout(wave) => self.phase.restart(
                &format!("step {step} rollout, wave {wave}"),
                "prompts",
                self.prompts_per_step,
            ),
            Phase::Update => self
                .phase
                .restart(&format!("step {step} update"), "tokens", 0),
        }
    }

    pub(crate) fn show(&mut self, e: LoopEvent<'_>) {
        match e {
            LoopEvent::Rollout {
                step,
                wave,
                progress: p,
            } => {
                self.start(step, Phase::Rollout(wave));
                self.phase.set_length(p.prompts as u64);
                let message = super::rollout::rollout_message(&p);
                self.phase.update(p.prompts_done as u64, message);
                if p.prompts_done == p.prompts {
                    self.start(step, Phase::Update);
                }
            }
            LoopEvent::Update { step, progress: p } => {
                self.start(step, Phase::Update);
                super::update::show_update(&self.phase, &p);
            }
            LoopEvent::Evaluating { step } => {
                self.showing = None;
                self.phase
                    .status(&format!("step {step} eval"), "greedy, test split");
            }
            LoopEvent::Step(line) => {
                self.steps.suspend(|| print_step(line));
                if line.step > 0 {
                    let message = format!("reward {:.3}", line.reward_mean);
                    self.steps.update(line.step, message);
                }
                if line.step < self.last_step {
                    self.start(line.step + 1, Phase::Rollout(1));
                }
            }
            LoopEvent::Checkpoint { .. } => {}
        }
    }

    pub(crate) fn finish(&self) {
        self.phase.clear();
        self.steps.finish();
    }
}

/// The view, even if a panic elsewhere poisoned its lock (it only shows).
fn lock(view: &Mutex<TrainView>) -> MutexGuard<'_, TrainView> {
    view.lock().unwrap_or_else(|e| e.into_inner())
}

fn print_step(l: &StepLog) {
    let eval = l
        .eval_reward
        .map_or_else(|| "–".to_string(), |r| format!("{r:.3}"));
    if l.step == 0 {
        println!("step 0 (before RL): eval reward {eval}");
        return;
    }
    println!(
        "step {}: reward {:.3}, eval {eval}, {} rollouts, {} tokens computed ({:.0} tok/s), loss {:.4}, grad norm {:.3}, {:.0} s rollout + {:.0} s update",
        l.step,
        l.reward_mean,
        l.rollouts,
        l.tokens.computed,
        l.tokens.computed as f64 / l.rollout_seconds.max(1e-9),
        l.loss,
        l.grad_norm,
        l.rollout_seconds,
        l.update_seconds
    );
}
