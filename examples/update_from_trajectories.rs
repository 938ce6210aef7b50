//! One policy-gradient update from a rollout's exported trajectories: verl's clipped
//! loss on the default model, written as an HF checkpoint (what `treegrpo update`
//! does, from the library).
//!
//! `cargo run --release --example update_from_trajectories [-- TRAJECTORIES.jsonl [OUT_DIR]]`
//!
//! `TRAJECTORIES.jsonl` is what `treegrpo rollout --out DIR` writes
//! (`DIR/trajectories.jsonl`). Without it the example first rolls out two prompts of
//! the built-in calc task as trees (M=2, N=2, L=1; one calculator turn, 64-token steps)
//! into a folder under the system's temp directory, the same files. The untrained
//! default model rarely answers at all; under seed 1 a few of its 12 trajectories do,
//! so their advantages are not all zero. The checkpoint goes to `OUT_DIR`
//! (default: `treegrpo-example-checkpoint` under the temp directory; about 1.6 GB with
//! the optimiser's state) and loads anywhere the product takes `--model`.
//!
//! It prints the update's loss, the gradient norm before clipping, and
//! `rollout_logprob_diff_max`: how far the trainer's log-probabilities of the sampled
//! tokens lie from the ones the engine recorded while sampling them. The default model
//! is fetched on first use, as in `embed_engine`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::env::{Task, TaskData};
use treegrpo::model::{fetch, LoadedModel};
use treegrpo::rollout::{run_rollout, Output, RolloutRequest, RunHooks, RunOptions, TreeOptions};
use treegrpo::train::input::read_trajectories;
use treegrpo::train::{update_checkpoint, OptimizerConfig, UpdateConfig};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1).map(PathBuf::from);
    let given = args.next();
    let out = args
        .next()
        .unwrap_or_else(|| std::env::temp_dir().join("treegrpo-example-checkpoint"));
    let model_path = fetch::ensure_default_model(&mut |msg| eprintln!("{msg}"))?;
    let trajectories = match given {
        Some(path) => path,
        None => rollout(
            &model_path,
            &std::env::temp_dir().join("treegrpo-example-rollout"),
        )?,
    };

    let model = LoadedModel::load(&model_path)?;
    // Every line is checked against the model before anything is computed.
    let data = read_trajectories(&trajectories, model.model.config())?;
    println!(
        "{} trajectories from {} (sampled at temperature {})",
        data.samples.len(),
        trajectories.display(),
        data.temperature
    );
    let t0 = Instant::now();
    let report = update_checkpoint(
        model,
        &model_path,
        &data,
        OptimizerConfig::default(),
        UpdateConfig::default(),
        &out,
        &mut |p| {
            eprint!(
                "\rmicro-batch {}/{}: {}/{} rows",
                p.micro_batches_done, p.micro_batches, p.rows_done, p.rows
            );
        },
    )?;
    eprintln!();
    let m = &report.metrics;
    println!(
        "update step {} in {:.1} s: {} loss tokens, {} rows forwarded (packed; {} unpacked)",
        report.step,
        t0.elapsed().as_secs_f64(),
        m.tokens,
        m.tokens_forwarded.packed,
        m.tokens_forwarded.unpacked
    );
    println!("loss                     {:.6}", m.loss);
    println!("grad norm                {:.6}", m.grad_norm);
    match m.rollout_logprob_diff_max {
        Some(d) => println!("rollout_logprob_diff_max {d:.3e}"),
        None => println!("rollout_logprob_diff_max - (the trajectories carry no logprobs)"),
    }
    println!("checkpoint written to {}", out.display());
    Ok(())
}

/// Rolls out two calc prompts as trees, writing `trajectories.jsonl`, `forest.jsonl`
/// and `summary.json` into `dir`; returns the trajectories' path.
fn rollout(model_path: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let model = Arc::new(LoadedModel::load(model_path)?);
    let config = EngineConfig {
        kv_budget_bytes: 256 << 20,
        ..EngineConfig::default()
    };
    let engine = Engine::start(model, config)?;
    let (env, samples) = Task::Calc.setup(&TaskData::Embedded, 1, 2)?;
    let tree_config = TreeOptions {
        max_step_tokens: 64,
        seed: 1,
        ..TreeOptions::default()
    }
    .config()?;
    let request = RolloutRequest {
        env,
        samples,
        options: RunOptions::new(tree_config.default_advantage()),
        config: tree_config,
    };
    let hooks = RunHooks {
        output: Some(Output::create(dir)?),
        ..RunHooks::default()
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let summary = runtime
        .block_on(run_rollout(engine, request, hooks))?
        .summary;
    println!(
        "rolled out {} prompts: {} trajectories, mean reward {:.3}, {:.1} s",
        summary.prompts, summary.rollouts, summary.mean_reward, summary.wall_seconds
    );
    Ok(dir.join("trajectories.jsonl"))
}
