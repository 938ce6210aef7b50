//! `treegrpo update`: one policy-gradient update of a model on exported trajectories,
//! written as an HF checkpoint, with one JSON line of metrics on stdout.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::DType;
use clap::Args;
use treegrpo::train::input::read_trajectories;
use treegrpo::train::{
    load_optimizer, save_checkpoint, update_with_progress, CheckpointExtras, LossAgg, LossConfig,
    Optimizer, OptimizerConfig, OptimizerKind, Params, UpdateConfig,
};

#[derive(Debug, Args)]
pub struct UpdateArgs {
    /// GGUF file or HF directory (default: the default model). A checkpoint written by
    /// an earlier update also restores its optimiser state.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// `trajectories.jsonl` as `treegrpo rollout` writes it.
    #[arg(long)]
    pub trajectories: PathBuf,
    #[arg(long, default_value = "adamw")]
    pub optimizer: OptimizerKind,
    #[arg(long, default_value_t = 1e-6)]
    pub lr: f64,
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Warm-up steps of a linear learning-rate ramp (0: constant).
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: u64,
    #[arg(long, default_value_t = 0.2)]
    pub clip_low: f64,
    #[arg(long, default_value_t = 0.2)]
    pub clip_high: f64,
    /// Dual-clip bound for negative advantages.
    #[arg(long, default_value_t = 3.0)]
    pub clip_c: f64,
    #[arg(long, default_value = "token-mean")]
    pub loss_agg: LossAgg,
    /// k3 KL coefficient (the reference is the model before the update).
    #[arg(long, default_value_t = 0.001)]
    pub kl_coef: f64,
    #[arg(long, default_value_t = 0.001)]
    pub entropy_coef: f64,
    /// Cap of the truncated importance weight between rollout and trainer logprobs.
    #[arg(long, default_value_t = 2.0)]
    pub tis_cap: f64,
    /// Global grad-norm clip (0: none).
    #[arg(long, default_value_t = 1.0)]
    pub max_grad_norm: f64,
    /// Forward every trajectory whole instead of each prompt's trajectories as a trie.
    #[arg(long)]
    pub no_packed: bool,
    /// Rows per micro-batch (bounds memory; gradients accumulate across them).
    #[arg(long, default_value_t = 2048)]
    pub micro_batch_tokens: usize,
    /// Output folder for the new checkpoint (replaced only once it is whole).
    #[arg(long)]
    pub out: PathBuf,
}

/// Peak resident memory of this process (`VmHWM`), in bytes; 0 where unknown.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

pub fn run(a: UpdateArgs) -> anyhow::Result<()> {
    let t0 = Instant::now();
    anyhow::ensure!(
        a.lr.is_finite() && a.lr >= 0.0,
        "--lr must be a non-negative number"
    );
    anyhow::ensure!(
        a.micro_batch_tokens > 0,
        "--micro-batch-tokens must be at least 1"
    );
    let m = super::load_model(a.model.as_deref())?;
    // Check the input before the (slower) dequantisation, and before anything is written.
    let data = read_trajectories(&a.trajectories, m.model.config())?;
    eprintln!(
        "{} trajectories at temperature {}; preparing f32 weights",
        data.samples.len(),
        data.temperature
    );
    let params = Params::from_model(&m.model, DType::F32)?;
    let config = OptimizerConfig {
        kind: a.optimizer,
        lr: a.lr,
        weight_decay: a.weight_decay,
        warmup_steps: a.warmup_steps,
        ..OptimizerConfig::default()
    };
    let mut optimizer = match a.model.as_deref().filter(|p| p.is_dir()) {
        Some(dir) => match load_optimizer(dir, &params)? {
            Some(mut o) if o.config.kind == config.kind => {
                o.config = config;
                o
            }
            _ => Optimizer::new(config),
        },
        None => Optimizer::new(config),
    };
    let cfg = UpdateConfig {
        loss: LossConfig {
            clip_low: a.clip_low,
            clip_high: a.clip_high,
            clip_c: a.clip_c,
            agg: a.loss_agg,
            kl_coef: a.kl_coef,
            entropy_coef: a.entropy_coef,
            tis_cap: a.tis_cap,
        },
        max_grad_norm: a.max_grad_norm,
        packed: !a.no_packed,
        micro_batch_tokens: a.micro_batch_tokens,
        temperature: data.temperature,
    };
    let t_update = Instant::now();
    let metrics = update_with_progress(&params, &mut optimizer, &data.samples, &cfg, &mut |p| {
        eprint!(
            "\rmicro-batch {}/{}: {}/{} rows, {:.0} s",
            p.micro_batches_done,
            p.micro_batches,
            p.rows_done,
            p.rows,
            t_update.elapsed().as_secs_f64()
        );
    })?;
    eprintln!();
    save_checkpoint(
        &a.out,
        &params,
        CheckpointExtras {
            loop_state: None,
            tokenizer: &m.tokenizer,
            chat_template: m.chat_template.as_ref(),
            optimizer: Some(&optimizer),
        },
    )?;
    let mut line = serde_json::to_value(&metrics)?;
    line["seconds"] = t0.elapsed().as_secs_f64().into();
    line["update_seconds"] = metrics.seconds.into();
    line["peak_rss_bytes"] = peak_rss_bytes().into();
    line["step"] = optimizer.step.into();
    println!("{line}");
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
