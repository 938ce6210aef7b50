//! `treegrpo update`: one policy-gradient update of a model on exported trajectories,
//! written as an HF checkpoint, with one JSON line of metrics on stdout.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use treegrpo::train::input::read_trajectories;
use treegrpo::train::{update_checkpoint, UpdateProgress};

use super::progress::Progress;

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

/// An update's micro-batch on its bar. The unit is the packed token rows forwarded
/// (micro-batches differ in size): the tokens/s a trainer is measured by.
pub(crate) fn show_update(bar: &Progress, p: &UpdateProgress) {
    bar.set_length(p.rows as u64);
    bar.update(
        p.rows_done as u64,
        format!("micro-batch {}/{}", p.micro_batches_done, p.micro_batches),
    );
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
    let bar = Progress::new("update", "tokens", 0);
    let report = update_checkpoint(
        m,
        &model_path,
        &data,
        a.update.optimizer_config(),
        a.update.update_config(data.temperature),
        &a.out,
        &mut |p| show_update(&bar, &p),
    )?;
    bar.finish();
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
