//! Command-line front end: flags in, tables and text out, no logic of its own.

mod bench;
mod compare;
mod data;
mod flags;
mod generate;
mod interrupt;
mod model;
mod plot;
mod progress;
mod rollout;
mod serve;
mod sft;
mod train;
mod update;
mod view;

use clap::{Parser, Subcommand};

/// Tree-GRPO rollouts for LLM agents on a KV cache that forks shared prefixes.
#[derive(Debug, Parser)]
#[command(name = "treegrpo", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Manage models (fetch the default model, show a model's config).
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// Generate a completion for one prompt.
    Generate(generate::GenerateArgs),
    /// Tree-GRPO rollouts (or GRPO chains) on a built-in task, exported for trainers.
    Rollout(rollout::RolloutArgs),
    /// Generate data sets for the built-in environments.
    #[command(subcommand)]
    Data(data::DataCommand),
    /// Draw forest.jsonl as one self-contained HTML page.
    View(view::ViewArgs),
    /// Tokens and time per rollout: chain vs trees vs recompute, same prompts and seed.
    Bench(bench::BenchArgs),
    /// One policy-gradient update (verl's clipped loss) on exported trajectories.
    Update(update::UpdateArgs),
    /// Supervised warm-start on the task oracle's demonstrations (an HF checkpoint).
    Sft(sft::SftArgs),
    /// The closed loop: rollouts, advantages, an update and a weight swap per step.
    Train(train::TrainArgs),
    /// Learning per computed token: tree vs chain and the ablations, at an equal
    /// token budget per step, seeds, eval curves, summary and report (resumable).
    Compare(compare::CompareArgs),
    /// Reward curves of training runs against tokens computed, as SVG.
    Plot(plot::PlotArgs),
    /// HTTP server for trainers: OpenAI-compatible, SGLang-style /generate, fork
    /// sessions, tree rollouts, weight reload, metrics.
    Serve(serve::ServeArgs),
}

pub fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Model(c) => model::run(c),
        Command::Generate(a) => generate::run(a),
        Command::Data(c) => data::run(c),
        Command::Rollout(a) => rollout::run(a),
        Command::View(a) => view::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Update(a) => update::run(a),
        Command::Sft(a) => sft::run(a),
        Command::Train(a) => train::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Plot(a) => plot::run(a),
        Command::Serve(a) => serve::run(a),
    }
}

/// Loads `--model`, or the default model (fetched on first use).
pub(crate) fn load_model(
    path: Option<&std::path::Path>,
) -> anyhow::Result<treegrpo::model::LoadedModel> {
    let path = treegrpo::model::fetch::model_path_or_default(path, &mut |m| eprintln!("{m}"))?;
    Ok(treegrpo::model::LoadedModel::load(&path)?)
}
