//! `treegrpo sft`: the supervised warm-start on the task oracle's demonstrations,
//! written as an HF checkpoint (with `sft_log.jsonl` and `sft_summary.json` in it).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use treegrpo::closed_loop::{
    run_warm_start, EvalPoint, SftConfig, SftStepLog, WarmStartConfig, WarmStartEvent,
    WarmStartInputs,
};
use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::env::Split;
use treegrpo::model::kernels::WeightFormat;
use treegrpo::train::Params;

use super::progress::Progress;

#[derive(Debug, Args)]
pub struct SftArgs {
    #[command(flatten)]
    pub source: super::flags::TaskFlags,
    /// Demonstrations: the oracle plays the first N training questions.
    #[arg(long, default_value_t = 32)]
    pub examples: usize,
    #[arg(long, default_value_t = 2)]
    pub epochs: usize,
    /// Demonstrations per optimiser step.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 1e-4)]
    pub lr: f64,
    /// Tool turns before the forced answer turn (as for rollout).
    #[arg(long, default_value_t = 3)]
    pub turns: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Greedy mean reward on this many test questions before and after (0: none).
    #[arg(long, default_value_t = 0)]
    pub eval_prompts: usize,
    /// Most tokens per agent step when evaluating.
    #[arg(long, default_value_t = 128)]
    pub max_step_tokens: usize,
    /// Output folder: the HF checkpoint.
    #[arg(long)]
    pub out: PathBuf,
}

/// A warm-start's events on stderr (`treegrpo sft`, and `treegrpo train
/// --warm-start`), on one display: its steps as a bar (from the start, which the
/// oracle's demonstrations are part of), an evaluation as a status until it ends,
/// results as lines above.
pub(crate) struct WarmStartView {
    bar: Progress,
    prefix: &'static str,
    /// The questions the oracle's demonstrations come from.
    questions: usize,
}

impl WarmStartView {
    /// Made just before the warm-start runs: its time counts from here.
    pub(crate) fn new(prefix: &'static str, questions: usize) -> Self {
        WarmStartView {
            bar: Progress::new(prefix, "steps", 0),
            prefix,
            questions,
        }
    }

    pub(crate) fn show(&mut self, e: WarmStartEvent<'_>) {
        let prefix = self.prefix;
        match e {
            WarmStartEvent::Evaluating { prompts, .. } => {
                let message = format!("evaluating on {prompts} test questions (greedy)");
                self.bar.status(prefix, &message);
            }
            WarmStartEvent::Evaluated { point, evaluation } => {
                let when = match point {
                    EvalPoint::Before => "before",
                    EvalPoint::After => "after",
                };
                self.bar.println(format!(
                    "{prefix}: mean reward {when} {:.3} ({:.0} s)",
                    evaluation.mean_reward, evaluation.seconds
                ));
                match point {
                    // The demonstrations and the steps start now.
                    EvalPoint::Before => self.bar.restart(prefix, "steps", 0),
                    EvalPoint::After => self.bar.clear(),
                }
            }
            WarmStartEvent::Step {
                line,
                epochs,
                total,
            } => {
                self.bar.set_length(total as u64);
                self.bar.update(line.step, step_message(line, epochs));
            }
            WarmStartEvent::Trained(ws) => {
                self.bar.finish();
                let nll = |l: Option<&SftStepLog>| l.map_or(0.0, |l| l.nll);
                self.bar.println(format!(
                    "{prefix}: {} steps, nll {:.3} → {:.3}; {} demonstrations of {} questions \
                     (mean reward {:.3}), {} model tokens",
                    ws.steps.len(),
                    nll(ws.steps.first()),
                    nll(ws.steps.last()),
                    ws.demonstrations,
                    self.questions,
                    ws.demonstration_reward,
                    ws.model_tokens
                ));
            }
        }
    }
}

/// What a warm-start step's bar shows beside the steps.
fn step_message(l: &SftStepLog, epochs: usize) -> String {
    format!(
        "epoch {}/{epochs}, nll {:.4}, grad norm {:.3}",
        l.epoch + 1,
        l.nll,
        l.grad_norm
    )
}

pub fn run(a: SftArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.examples > 0, "--examples must be at least 1");
    anyhow::ensure!(a.batch_size > 0, "--batch-size must be at least 1");
    anyhow::ensure!(a.lr.is_finite() && a.lr >= 0.0, "--lr must be non-negative");
    let model = Arc::new(super::load_model(a.source.model.as_deref())?);
    let data = a.source.data();
    let (env, demos) = a.source.task.setup(&data, a.turns, a.examples)?;
    let test = a.source.task.split(&data, Split::Test, a.eval_prompts)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // An engine only to evaluate (before and after).
    let engine = if test.is_empty() {
        None
    } else {
        Some(Engine::start(model.clone(), EngineConfig::default())?)
    };
    let params = Params::trainable(&model.model)?;
    let cfg = WarmStartConfig {
        task: Some(a.source.task),
        lr: a.lr,
        sft: SftConfig {
            epochs: a.epochs,
            batch_size: a.batch_size,
            seed: a.seed,
            ..SftConfig::default()
        },
        max_step_tokens: a.max_step_tokens,
        evaluate_after: true,
        serve_format: WeightFormat::F32,
    };
    let inputs = WarmStartInputs {
        model: &model,
        engine: engine.as_ref(),
        env: &env,
        demos: &demos,
        test: &test,
        params: &params,
    };
    let mut view = WarmStartView::new("sft", demos.len());
    let warm = rt.block_on(run_warm_start(inputs, &cfg, &mut |e| view.show(e)))?;
    warm.save_checkpoint(&a.out, &params, &model)?;
    println!("{}", serde_json::to_string(&warm.record)?);
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
