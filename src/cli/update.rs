//! `treegrpo update`: one policy-gradient update of a model on exported trajectories,
//! written as an HF checkpoint, with one JSON line of metrics on stdout.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use treegrpo::train::input::read_trajectories;
use treegrpo::train::update_checkpoint;

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
    let model_path = match a.model.as_deref() {
        Some(p) => p.to_path_buf(),
        None => treegrpo::model::fetch::default_model_path(),
    };
    let t_update = Instant::now();
    let report = update_checkpoint(
        m,
        &model_path,
        &data,
        a.update.optimizer_config(),
        a.update.update_config(data.temperature),
        &a.out,
        &mut |p| {
            eprint!(
                "\rmicro-batch {}/{}: {}/{} rows, {:.0} s",
                p.micro_batches_done,
                p.micro_batches,
                p.rows_done,
                p.rows,
                t_update.elapsed().as_secs_f64()
            );
        },
    )?;
    eprintln!();
    let metrics = report.metrics;
    let mut line = serde_json::to_value(&metrics)?;
    line["seconds"] = t0.elapsed().as_secs_f64().into();
    line["update_seconds"] = metrics.seconds.into();
    line["peak_rss_bytes"] = peak_rss_bytes().into();
    line["step"] = report.step.into();
    println!("{line}");
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
