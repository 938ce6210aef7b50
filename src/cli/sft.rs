//! `treegrpo sft`: the supervised warm-start on the task oracle's demonstrations,
//! written as an HF checkpoint (with `sft_log.jsonl` and `sft_summary.json` in it).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::DType;
use clap::Args;
use treegrpo::closed_loop::{
    run_warm_start, SftConfig, SftStepLog, WarmStartConfig, WarmStartEvent, WarmStartInputs,
};
use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::env::Split;
use treegrpo::model::kernels::WeightFormat;
use treegrpo::train::Params;

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

/// One warm-start step on the progress line.
pub(crate) fn print_sft_step(l: &SftStepLog, epochs: usize, total_steps: usize) {
    eprint!(
        "\rwarm-start epoch {}/{epochs} step {}/{total_steps}: nll {:.4}, grad norm {:.3}, {:.0} s   ",
        l.epoch + 1,
        l.step,
        l.nll,
        l.grad_norm,
        l.seconds
    );
    let _ = std::io::stderr().flush();
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
    let params = Params::from_model(&model.model, DType::F32)?;
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
    let questions = demos.len();
    let warm = rt.block_on(run_warm_start(inputs, &cfg, &mut |e| show(e, questions)))?;
    warm.save_checkpoint(&a.out, &params, &model)?;
    println!("{}", serde_json::to_string(&warm.record)?);
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

/// A warm-start event on stderr.
fn show(e: WarmStartEvent<'_>, questions: usize) {
    match e {
        WarmStartEvent::Evaluating { prompts, .. } => {
            eprint!("evaluating on {prompts} test questions (greedy) … ")
        }
        WarmStartEvent::Evaluated { evaluation: e, .. } => {
            eprintln!("mean reward {:.3} ({:.0} s)", e.mean_reward, e.seconds)
        }
        WarmStartEvent::Step {
            line,
            epochs,
            total,
        } => print_sft_step(line, epochs, total),
        WarmStartEvent::Trained(ws) => {
            eprintln!();
            eprintln!(
                "{} demonstrations of {questions} questions (mean reward {:.3}), {} model tokens",
                ws.demonstrations, ws.demonstration_reward, ws.model_tokens
            );
        }
    }
}
