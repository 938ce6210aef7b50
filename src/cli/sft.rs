//! `treegrpo sft`: the supervised warm-start on the task oracle's demonstrations,
//! written as an HF checkpoint (with `sft_log.jsonl` and `sft_summary.json` in it).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::DType;
use clap::Args;
use treegrpo::closed_loop::{evaluate, warm_start, SftConfig, SftStepLog};
use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::env::Split;
use treegrpo::model::kernels::WeightFormat;
use treegrpo::train::{save_checkpoint, CheckpointExtras, Params};

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

fn write_json(path: &std::path::Path, value: &serde_json::Value) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(value)? + "\n")
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
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
    let (env, samples) = a.source.task.setup(&data, a.turns, a.examples)?;
    let test = a.source.task.split(&data, Split::Test, a.eval_prompts)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let engine = if test.is_empty() {
        None
    } else {
        Some(Engine::start(model.clone(), EngineConfig::default())?)
    };
    let eval = |engine: &Engine| -> anyhow::Result<f64> {
        eprint!("evaluating on {} test questions (greedy) … ", test.len());
        let e = rt.block_on(evaluate(engine, &env, &test, a.max_step_tokens))?;
        eprintln!("mean reward {:.3} ({:.0} s)", e.mean_reward, e.seconds);
        Ok(e.mean_reward)
    };
    let before = engine.as_ref().map(eval).transpose()?;

    let params = Params::from_model(&model.model, DType::F32)?;
    let cfg = SftConfig {
        epochs: a.epochs,
        batch_size: a.batch_size,
        seed: a.seed,
        ..SftConfig::default()
    };
    let total_steps = samples.len().div_ceil(a.batch_size) * a.epochs;
    let ws = rt.block_on(warm_start(
        &model,
        env.as_ref(),
        &samples,
        &params,
        a.lr,
        &cfg,
        &mut |l| print_sft_step(l, a.epochs, total_steps),
    ))?;
    eprintln!();
    eprintln!(
        "{} demonstrations of {} questions (mean reward {:.3}), {} model tokens",
        ws.demonstrations,
        samples.len(),
        ws.demonstration_reward,
        ws.model_tokens
    );
    let after = match &engine {
        Some(engine) => {
            let served = params.to_model(WeightFormat::F32)?;
            rt.block_on(engine.load_weights(Arc::new(served)))?;
            Some(eval(engine)?)
        }
        None => None,
    };
    save_checkpoint(
        &a.out,
        &params,
        CheckpointExtras {
            tokenizer: &model.tokenizer,
            chat_template: model.chat_template.as_ref(),
            optimizer: None,
            loop_state: None,
        },
    )?;
    let logs = &ws.steps;
    let log: String = logs
        .iter()
        .map(|l| serde_json::to_string(l).map(|s| s + "\n"))
        .collect::<Result<_, _>>()?;
    let log_path = a.out.join("sft_log.jsonl");
    std::fs::write(&log_path, log).map_err(|e| anyhow::anyhow!("{}: {e}", log_path.display()))?;
    let summary = serde_json::json!({
        "task": a.source.task,
        "demonstrations": ws.demonstrations,
        "demonstration_reward": ws.demonstration_reward,
        "model_tokens": ws.model_tokens,
        "epochs": a.epochs,
        "steps": logs.len(),
        "lr": a.lr,
        "first_nll": logs.first().map(|l| l.nll),
        "last_nll": logs.last().map(|l| l.nll),
        "eval_prompts": test.len(),
        "eval_reward_before": before,
        "eval_reward_after": after,
        "seconds": logs.iter().map(|l| l.seconds).sum::<f64>(),
    });
    write_json(&a.out.join("sft_summary.json"), &summary)?;
    println!("{summary}");
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
