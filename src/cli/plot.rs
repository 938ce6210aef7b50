//! `treegrpo plot`: reward and eval reward of one or more training runs against
//! cumulative computed tokens, as one SVG.

use std::path::{Path, PathBuf};

use clap::Args;
use treegrpo::closed_loop::read_log;
use treegrpo::view::plot::{reward_svg, RewardSeries};

#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Run folders written by `treegrpo train` (each has a log.jsonl).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    #[arg(long, default_value = "reward.svg")]
    pub out: PathBuf,
}

/// A run's label: its folder name.
fn label(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Reads each run's log and writes the chart to `out`.
pub fn write_plot(runs: &[PathBuf], out: &Path) -> anyhow::Result<()> {
    let mut series = Vec::new();
    for dir in runs {
        let lines = read_log(&dir.join("log.jsonl"))?;
        let x = |l: &treegrpo::closed_loop::StepLog| l.tokens.cumulative_computed as f64;
        series.push(RewardSeries {
            label: label(dir),
            reward: lines
                .iter()
                .filter(|l| l.step > 0)
                .map(|l| (x(l), l.reward_mean))
                .collect(),
            eval: lines
                .iter()
                .filter_map(|l| l.eval_reward.map(|r| (x(l), r)))
                .collect(),
        });
    }
    let svg = reward_svg(&series, 900, 560)?;
    std::fs::write(out, svg).map_err(|e| anyhow::anyhow!("{}: {e}", out.display()))
}

pub fn run(a: PlotArgs) -> anyhow::Result<()> {
    write_plot(&a.runs, &a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
