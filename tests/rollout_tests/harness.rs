//! Running the search-QA task's first training questions through `run_rollout` on
//! the default model, with the files checked against the in-memory result.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use treegrpo::advantage::AdvantageMode;
use treegrpo::engine::{Engine, EngineConfig, Sampling};
use treegrpo::env::{load_samples, EnvConfig, Environment, SearchQaEnv, DEFAULT_TOP_K};
use treegrpo::model::LoadedModel;
use treegrpo::rollout::export::TrajectoryRecord;
use treegrpo::rollout::{
    run_rollout, Output, RolloutRequest, RolloutResult, RunHooks, RunOptions, RunSummary,
    Selection, TreeConfig, TreeShape,
};

use super::common;

pub fn data(f: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/multihop")
        .join(f)
}

pub fn tree_config(prefix_reuse: bool) -> TreeConfig {
    TreeConfig {
        shape: TreeShape::tree(2, 2, 1, Selection::Paper),
        sampling: Sampling::Random {
            min_p: None,
            temperature: 1.0,
            top_k: None,
            top_p: None,
        },
        max_step_tokens: 40,
        seed: 7,
        prefix_reuse,
        branch_sampling: None,
    }
}

pub fn run(
    model: &Arc<LoadedModel>,
    cfg: TreeConfig,
    max_batch_seqs: usize,
    out: Option<&Path>,
) -> RunSummary {
    run_with(
        model,
        cfg,
        max_batch_seqs,
        out,
        RunOptions::new(AdvantageMode::Tree),
    )
    .0
}

/// Runs and also returns the records and the tokens the engine computed meanwhile.
pub fn run_with(
    model: &Arc<LoadedModel>,
    cfg: TreeConfig,
    max_batch_seqs: usize,
    out: Option<&Path>,
    options: RunOptions,
) -> (RunSummary, Vec<TrajectoryRecord>, u64) {
    let engine = EngineConfig {
        max_batch_seqs,
        prefix_cache: cfg.prefix_reuse,
        ..EngineConfig::default()
    };
    let (result, computed) = run_on(model, cfg, engine, out, options, 2);
    (result.summary, result.records, computed)
}

/// Runs the first `prompts` training questions on an engine of the given config.
pub fn run_on(
    model: &Arc<LoadedModel>,
    cfg: TreeConfig,
    engine: EngineConfig,
    out: Option<&Path>,
    options: RunOptions,
    prompts: usize,
) -> (RolloutResult, u64) {
    let engine = Engine::start(model.clone(), engine).unwrap();
    let rt = common::runtime();
    let output = out.map(|d| Output::create(d).unwrap());
    let before = rt.block_on(engine.stats()).unwrap().counters.computed();
    let request = request(cfg, options, prompts);
    let hooks = RunHooks {
        output,
        ..RunHooks::default()
    };
    let result = rt
        .block_on(run_rollout(engine.clone(), request, hooks))
        .unwrap();
    if let Some(dir) = out {
        // The files are one consumer of the in-memory result: the same lines.
        let (trees, records) = jsonl(&result);
        assert_eq!(
            std::fs::read_to_string(dir.join("forest.jsonl")).unwrap(),
            trees
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("trajectories.jsonl")).unwrap(),
            records
        );
    }
    let after = rt.block_on(engine.stats()).unwrap().counters.computed();
    (result, after - before)
}

/// The first `prompts` training questions of the search-QA task as a request.
pub fn request(config: TreeConfig, options: RunOptions, prompts: usize) -> RolloutRequest {
    let env: Arc<dyn Environment> = Arc::new(
        SearchQaEnv::from_corpus_file(&data("corpus.jsonl"), DEFAULT_TOP_K, EnvConfig::default())
            .unwrap(),
    );
    let samples: Vec<_> = load_samples(&data("train.jsonl"))
        .unwrap()
        .into_iter()
        .take(prompts)
        .collect();
    RolloutRequest {
        env,
        samples,
        config,
        options,
    }
}

/// The trees and records of a result as `forest.jsonl` and `trajectories.jsonl` hold
/// them.
pub fn jsonl(result: &RolloutResult) -> (String, String) {
    let lines = |items: Vec<String>| items.into_iter().map(|l| l + "\n").collect::<String>();
    let trees = result
        .trees
        .iter()
        .map(|t| serde_json::to_string(t).unwrap());
    let records = result
        .records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap());
    (lines(trees.collect()), lines(records.collect()))
}
