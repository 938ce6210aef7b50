//! `treegrpo data gen`: regenerate the built-in environments' data sets.

use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};
use treegrpo::env::datagen::{
    generate_calc, generate_multihop, MultihopSizes, COMMITTED_CALC_SIZES,
};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Task {
    /// Fictional-entity search QA, 1-hop and 2-hop bridge questions.
    Multihop,
    /// Multi-step arithmetic word problems.
    Calc,
}

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Write a corpus and questions (deterministic in the seed).
    Gen {
        #[arg(long, value_enum, default_value = "multihop")]
        task: Task,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
    },
}

pub fn run(cmd: DataCommand) -> anyhow::Result<()> {
    let DataCommand::Gen { task, seed, out } = cmd;
    let dataset = match task {
        Task::Multihop => generate_multihop(seed, MultihopSizes::committed())?,
        Task::Calc => generate_calc(seed, COMMITTED_CALC_SIZES.0, COMMITTED_CALC_SIZES.1)?,
    };
    std::fs::create_dir_all(&out)?;
    dataset.write(&out)?;
    println!("wrote {}", out.display());
    Ok(())
}
