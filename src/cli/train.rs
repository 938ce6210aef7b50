//! `treegrpo train`: the closed loop — rollouts from the policy the engine serves,
//! advantages, one update, the new weights swapped into the engine, step after step;
//! `log.jsonl`, checkpoints, `--resume`, and `reward.svg` at the end.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::DType;
use clap::{Args, ValueEnum};
use treegrpo::advantage::AdvantageMode;
use treegrpo::closed_loop::{
    self, evaluate, LoopConfig, LoopEvent, LoopOutcome, SftConfig, StepLog, StopSignal, TrainRun,
};
use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::env::Split;
use treegrpo::model::kernels::WeightFormat;
use treegrpo::train::{KlReference, Optimizer, Params};

use super::flags::{TaskFlags, TreeFlags, UpdateFlags};

/// How the engine holds the trainer's weights after an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServeFormat {
    /// Exactly the trainer's values (the default).
    F32,
    /// Rounded to bf16: half the bytes a decode step reads.
    Bf16,
}

/// What the update's KL term compares the policy with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KlReferenceFlag {
    /// The policy before each update (the KL of a one-step update is 0; the default).
    Previous,
    /// The weights the run started from, after the warm-start, kept frozen in
    /// DIR/reference/ (one more forward per step, and a copy of the weights).
    Start,
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// `--model` may be a `treegrpo sft` checkpoint; a resumed run takes the model
    /// its run.json names unless `--model` is given.
    #[command(flatten)]
    pub source: TaskFlags,
    #[arg(long, default_value_t = 4)]
    pub steps: u64,
    #[arg(long, default_value_t = 8)]
    pub prompts_per_step: usize,
    #[command(flatten)]
    pub tree: TreeFlags,
    /// Advantage: tree, tree-2norm, inter, intra or grpo (default: tree for trees,
    /// grpo for chains).
    #[arg(long)]
    pub advantage: Option<AdvantageMode>,
    #[command(flatten)]
    pub update: UpdateFlags,
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
    #[arg(long, default_value_t = 0)]
    pub eval_every: u64,
    /// Test questions per evaluation (0: no evaluation).
    #[arg(long, default_value_t = 20)]
    pub eval_prompts: usize,
    /// Checkpoint every K steps (always after the last).
    #[arg(long, default_value_t = 1)]
    pub checkpoint_every: u64,
    /// How the engine holds the trained weights.
    #[arg(long, value_enum, default_value = "f32")]
    pub serve: ServeFormat,
    /// The KL term's reference (`--kl-coef`): previous or start. A resumed run keeps
    /// the one it was started with.
    #[arg(long, value_enum, default_value = "previous")]
    pub kl_reference: KlReferenceFlag,
    /// KV cache budget in MiB (default: a quarter of the available memory).
    #[arg(long)]
    pub kv_mib: Option<usize>,
    /// Most prompts grown at once (0: all).
    #[arg(long, default_value_t = 16)]
    pub concurrent_prompts: usize,
    /// Continue the run in DIR from its last checkpoint, with the flags it was started
    /// with (its log from there equals an uninterrupted run's); the model and the
    /// warm-start size come from DIR/run.json.
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    pub resume: Option<PathBuf>,
    /// Run folder: log.jsonl, checkpoint/, run.json, reward.svg.
    #[arg(long, required_unless_present = "resume")]
    pub out: Option<PathBuf>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("{}: {e}", path.display())
}

/// The source model a run folder's `run.json` names.
/// What a run folder's `run.json` records (the source model, the warm-start size).
fn recorded(dir: &Path) -> anyhow::Result<serde_json::Value> {
    let path = dir.join("run.json");
    let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
    Ok(serde_json::from_str(&text)?)
}

pub fn run(a: TrainArgs) -> anyhow::Result<()> {
    a.tree.check()?;
    a.update.check()?;
    anyhow::ensure!(
        a.prompts_per_step > 0,
        "--prompts-per-step must be at least 1"
    );
    let out = a
        .resume
        .clone()
        .or(a.out.clone())
        .expect("clap requires one");
    let record = a.resume.as_deref().map(recorded).transpose()?;
    let model_path = match (&a.source.model, &record) {
        (Some(m), _) => Some(m.clone()),
        (None, Some(r)) => r.get("model").and_then(|m| m.as_str()).map(PathBuf::from),
        (None, None) => None,
    };
    // RL prompts start after the warm-start's questions, so its rewards are not on
    // questions the model was shown solved.
    let warm_started = match &record {
        Some(r) => r.get("warm_start").and_then(|w| w.as_u64()).unwrap_or(0) as usize,
        None => a.warm_start,
    };
    let path = treegrpo::model::fetch::model_path_or_default(model_path.as_deref(), &mut |m| {
        eprintln!("{m}")
    })?;
    let model = Arc::new(treegrpo::model::LoadedModel::load(&path)?);
    let data = a.source.data();
    let (env, mut train) = a.source.task.setup(&data, a.tree.step.turns, usize::MAX)?;
    train.drain(..warm_started.min(train.len()));
    let test = a.source.task.split(&data, Split::Test, a.eval_prompts)?;
    let tree = a.tree.tree_config()?;
    let serve_format = match a.serve {
        ServeFormat::F32 => WeightFormat::F32,
        ServeFormat::Bf16 => WeightFormat::Bf16,
    };
    let advantage = a.advantage.unwrap_or(tree.default_advantage());
    let kl_reference = match &record {
        Some(r) => r
            .get("kl_reference")
            .map(|v| serde_json::from_value(v.clone()))
            .transpose()?
            .unwrap_or_default(),
        None => match a.kl_reference {
            KlReferenceFlag::Previous => KlReference::Previous,
            KlReferenceFlag::Start => KlReference::Start,
        },
    };
    let update = a.update.update_config(tree.sampling.logprob_temperature());
    let config = LoopConfig {
        steps: a.steps,
        prompts_per_step: a.prompts_per_step,
        tree,
        advantage,
        concurrent_prompts: a.concurrent_prompts,
        update,
        eval_every: a.eval_every,
        eval_prompts: a.eval_prompts,
        checkpoint_every: a.checkpoint_every,
        serve_format,
        kl_reference,
    };
    let engine = Engine::start(
        model.clone(),
        EngineConfig {
            kv_budget_bytes: super::flags::kv_budget_bytes(a.kv_mib),
            // Each step's trees are new prompts (and a swap clears the cache).
            reuse_cached_first: true,
            ..EngineConfig::default()
        },
    )?;
    eprintln!("preparing f32 trainer weights");
    let params = Params::from_model(&model.model, DType::F32)?;
    let optimizer = Optimizer::new(a.update.optimizer_config());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let served = if a.resume.is_none() && a.warm_start > 0 {
        Some(warm_start(
            &a,
            &rt,
            &model,
            &engine,
            &env,
            &test,
            &params,
            &out,
            serve_format,
        )?)
    } else {
        None
    };
    let mut run = TrainRun::new(
        engine,
        model,
        env.clone(),
        train,
        test,
        params,
        optimizer,
        config,
        out.clone(),
    )?;
    if let Some(model) = served {
        run.set_served(model);
    }
    if a.resume.is_some() {
        run = rt.block_on(run.resume())?;
        eprintln!("resuming after step {}", run.state.step);
    } else {
        let record = serde_json::json!({
            "model": path,
            "task": a.source.task,
            "warm_start": a.warm_start,
            "steps": a.steps,
            "prompts_per_step": a.prompts_per_step,
            "config": run.config.tree,
            "advantage": run.config.advantage,
            "update": run.config.update,
            "lr": a.update.lr,
            "optimizer": a.update.optimizer_config(),
            "kl_reference": run.config.kl_reference,
        });
        let p = out.join("run.json");
        std::fs::write(&p, serde_json::to_string_pretty(&record)? + "\n").map_err(io_err(&p))?;
    }

    let stop = Arc::new(StopSignal::default());
    let signal = stop.clone();
    let (first, second) = (
        super::interrupt::next_sigint(),
        super::interrupt::nth_sigint(2),
    );
    rt.spawn(async move {
        // First Ctrl-C: stop at the next safe point (the step in progress is dropped;
        // log and checkpoint stay whole). Second: leave at once (both are still whole).
        first.await;
        eprintln!("\ninterrupted: stopping (Ctrl-C again to quit now)");
        signal.raise();
        second.await;
        std::process::exit(130);
    });
    let steps = a.steps;
    let on_event = Box::new(move |e: LoopEvent<'_>| {
        match e {
            LoopEvent::Rollout { step, progress: p } => eprint!(
                "\r[step {step}/{steps}] rollout {}/{} prompts, {} rollouts, {:.0} tok/s      ",
                p.prompts_done,
                p.prompts,
                p.rollouts,
                p.computed_tokens as f64 / p.seconds.max(1e-9)
            ),
            LoopEvent::Update { step, progress: p } => eprint!(
                "\r[step {step}/{steps}] update micro-batch {}/{} ({}/{} rows)          ",
                p.micro_batches_done, p.micro_batches, p.rows_done, p.rows
            ),
            LoopEvent::Evaluating { step } => {
                eprint!("\r[step {step}/{steps}] evaluating (greedy, test split)          ")
            }
            LoopEvent::Step(line) => {
                eprint!("\r");
                print_step(line);
            }
            LoopEvent::Checkpoint { .. } => {}
        }
        let _ = std::io::stderr().flush();
    });
    let outcome = rt.block_on(run.run(stop, on_event))?;
    let svg = out.join("reward.svg");
    super::plot::write_plot(std::slice::from_ref(&out), &svg)?;
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

/// The warm-start before the loop: eval of the untrained model, SFT on the oracle's
/// demonstrations, the warm weights served (returned: the run trains on them);
/// `warm_start.json` and `sft_log.jsonl`.
#[allow(clippy::too_many_arguments)]
fn warm_start(
    a: &TrainArgs,
    rt: &tokio::runtime::Runtime,
    model: &Arc<treegrpo::model::LoadedModel>,
    engine: &Engine,
    env: &Arc<dyn treegrpo::env::Environment>,
    test: &[treegrpo::env::QaSample],
    params: &Params,
    out: &Path,
    serve_format: WeightFormat,
) -> anyhow::Result<Arc<treegrpo::model::Model>> {
    let before = if test.is_empty() {
        None
    } else {
        eprint!(
            "evaluating the untrained model on {} test questions (greedy) … ",
            test.len()
        );
        let e = rt.block_on(evaluate(engine, env, test, a.tree.step.max_step_tokens))?;
        eprintln!("eval reward {:.3}", e.mean_reward);
        Some(e.mean_reward)
    };
    let data = a.source.data();
    let samples = a.source.task.split(&data, Split::Train, a.warm_start)?;
    let cfg = SftConfig {
        epochs: a.warm_start_epochs,
        seed: a.tree.step.seed,
        ..SftConfig::default()
    };
    let total = samples.len().div_ceil(cfg.batch_size) * cfg.epochs;
    let epochs = cfg.epochs;
    let ws = rt.block_on(closed_loop::warm_start(
        model,
        env.as_ref(),
        &samples,
        params,
        a.warm_start_lr,
        &cfg,
        &mut |l| super::sft::print_sft_step(l, epochs, total),
    ))?;
    eprintln!();
    let served = Arc::new(params.to_model(serve_format)?);
    rt.block_on(engine.load_weights(served.clone()))?;
    let log: String = ws
        .steps
        .iter()
        .map(|l| serde_json::to_string(l).map(|s| s + "\n"))
        .collect::<Result<_, _>>()?;
    let p = out.join("sft_log.jsonl");
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    std::fs::write(&p, log).map_err(io_err(&p))?;
    let summary = serde_json::json!({
        "demonstrations": ws.demonstrations,
        "demonstration_reward": ws.demonstration_reward,
        "model_tokens": ws.model_tokens,
        "epochs": epochs,
        "lr": a.warm_start_lr,
        "steps": ws.steps.len(),
        "first_nll": ws.steps.first().map(|l| l.nll),
        "last_nll": ws.steps.last().map(|l| l.nll),
        "seconds": ws.steps.iter().map(|l| l.seconds).sum::<f64>(),
        "eval_reward_before": before,
    });
    let p = out.join("warm_start.json");
    std::fs::write(&p, serde_json::to_string_pretty(&summary)? + "\n").map_err(io_err(&p))?;
    eprintln!(
        "warm-start: {} demonstrations, nll {:.3} → {:.3}",
        ws.demonstrations,
        ws.steps.first().map_or(0.0, |l| l.nll),
        ws.steps.last().map_or(0.0, |l| l.nll)
    );
    Ok(served)
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
