//! `treegrpo update`: one policy-gradient update of a model on exported trajectories,
//! written as an HF checkpoint, with one JSON line of metrics on stdout.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::DType;
use clap::Args;
use treegrpo::train::input::read_trajectories;
use treegrpo::train::{
    load_optimizer, save_checkpoint, update_with_progress, CheckpointExtras, Optimizer, Params,
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
    #[command(flatten)]
    pub update: super::flags::UpdateFlags,
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
    a.update.check()?;
    let m = super::load_model(a.model.as_deref())?;
    // Check the input before the (slower) dequantisation, and before anything is written.
    let data = read_trajectories(&a.trajectories, m.model.config())?;
    eprintln!(
        "{} trajectories at temperature {}; preparing f32 weights",
        data.samples.len(),
        data.temperature
    );
    let params = Params::from_model(&m.model, DType::F32)?;
    let config = a.update.optimizer_config();
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
    let cfg = a.update.update_config(data.temperature);
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
