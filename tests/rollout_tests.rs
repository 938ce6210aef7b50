//! Tree rollouts on the default model and the search-QA task: nothing is computed
//! twice, trees have the expected shape, and a seed fixes the output bytes.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use treegrpo::advantage::AdvantageMode;
use treegrpo::engine::{Engine, EngineConfig, Sampling};
use treegrpo::env::{load_samples, EnvConfig, Environment, SearchQaEnv, DEFAULT_TOP_K};
use treegrpo::model::LoadedModel;
use treegrpo::rollout::export::TrajectoryRecord;
use treegrpo::rollout::{run_rollout, Output, RunOptions, RunSummary, Selection, TreeConfig};

fn data(f: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/multihop")
        .join(f)
}

fn tree_config(prefix_reuse: bool) -> TreeConfig {
    TreeConfig {
        trees: 2,
        expand: 2,
        rounds: 1,
        keep: None,
        selection: Selection::Paper,
        sampling: Sampling::Random {
            temperature: 1.0,
            top_k: None,
            top_p: None,
        },
        max_step_tokens: 40,
        seed: 7,
        prefix_reuse,
    }
}

fn run(
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
fn run_with(
    model: &Arc<LoadedModel>,
    cfg: TreeConfig,
    max_batch_seqs: usize,
    out: Option<&Path>,
    options: RunOptions,
) -> (RunSummary, Vec<TrajectoryRecord>, u64) {
    let engine = Engine::start(
        model.clone(),
        EngineConfig {
            max_batch_seqs,
            prefix_cache: cfg.prefix_reuse,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let env: Arc<dyn Environment> = Arc::new(
        SearchQaEnv::from_corpus_file(&data("corpus.jsonl"), DEFAULT_TOP_K, EnvConfig::default())
            .unwrap(),
    );
    let samples: Vec<_> = load_samples(&data("train.jsonl"))
        .unwrap()
        .into_iter()
        .take(2)
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let output = out.map(|d| Output::create(d).unwrap());
    let before = rt.block_on(engine.stats()).unwrap().counters.computed();
    let (summary, records) = rt
        .block_on(run_rollout(
            engine.clone(),
            env,
            samples,
            cfg,
            options,
            output,
            &mut |_| {},
            None,
        ))
        .unwrap();
    let after = rt.block_on(engine.stats()).unwrap().counters.computed();
    (summary, records, after - before)
}

#[test]
fn tree_rollouts_compute_no_token_twice_and_have_one_plus_nl_leaves() {
    let model = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let options = RunOptions::new(AdvantageMode::Tree);
    let (s, _, engine_computed) =
        run_with(&model, tree_config(true), 64, Some(dir.path()), options);
    assert_eq!(s.tokens.recomputed, 0);
    // Every token the engine computed is attributed to one forest or to the shared
    // prefix, and the per-forest figures add up to the totals.
    assert_eq!(s.tokens.computed, engine_computed);
    let forest_sum: u64 = s.forests.iter().map(|f| f.tokens.computed).sum();
    assert_eq!(forest_sum + s.shared_prefix.computed, engine_computed);
    assert_eq!(s.forests.len(), 2);
    for f in &s.forests {
        assert_eq!(f.rollouts, 6);
        assert_eq!(f.tokens.recomputed, 0);
        assert!(f.tokens.prompt_prefilled > 0 && f.tokens.decoded > 0);
    }
    // The prompt is prefilled once per prompt, not once per tree.
    let samples = load_samples(&data("train.jsonl")).unwrap();
    let env =
        SearchQaEnv::from_corpus_file(&data("corpus.jsonl"), DEFAULT_TOP_K, EnvConfig::default())
            .unwrap();
    let prompt_tokens: u64 = samples
        .iter()
        .take(2)
        .map(|q| model.chat_prompt(env.start(q).prompt()).unwrap().len() as u64)
        .sum();
    // Each prompt's tokens are either computed once for its forest or found in the
    // prefix cache (the system prompt all prompts share is computed once for the run).
    let forest_prompt: u64 = s
        .forests
        .iter()
        .map(|f| f.tokens.prompt_prefilled + f.tokens.reused_prefix_cache)
        .sum();
    assert_eq!(forest_prompt, prompt_tokens);
    assert!(s.shared_prefix.prompt_prefilled > 0);
    for f in &s.forests {
        assert!(f.tokens.reused_prefix_cache >= s.shared_prefix.prompt_prefilled);
    }
    // Every tree: its first chain plus N·L branches, each ending in one leaf.
    let forest = std::fs::read_to_string(dir.path().join("forest.jsonl")).unwrap();
    let trees: Vec<serde_json::Value> = forest
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(trees.len(), 4);
    for t in &trees {
        let leaves = t["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["terminal"] == true)
            .count();
        let (n, l) = (2, 1);
        assert_eq!(leaves, 1 + n * l, "tree {}", t["tree_id"]);
    }
    assert_eq!(s.rollouts, 12);
    let lines = std::fs::read_to_string(dir.path().join("trajectories.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 12);

    // The reference mode re-sends prefixes: same shape, many tokens recomputed.
    let r = run(&model, tree_config(false), 64, None);
    assert!(r.tokens.recomputed > 0);
    assert!(s.tokens_computed_per_rollout < r.tokens_computed_per_rollout);
}

#[test]
fn same_seed_same_bytes_whatever_the_batch_cap() {
    let model = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    run(&model, tree_config(true), 64, Some(a.path()));
    // A smaller batch cap and one prompt at a time: different batches, same bytes.
    let one_at_a_time = RunOptions {
        max_concurrent_prompts: 1,
        ..RunOptions::new(AdvantageMode::Tree)
    };
    run_with(&model, tree_config(true), 3, Some(b.path()), one_at_a_time);
    let fa = std::fs::read(a.path().join("trajectories.jsonl")).unwrap();
    let fb = std::fs::read(b.path().join("trajectories.jsonl")).unwrap();
    assert!(!fa.is_empty());
    assert!(
        fa == fb,
        "trajectories.jsonl differs between batch caps 64 and 3"
    );
}

/// A token budget stops new branches; the branches that do run are the same ones, with
/// the same tokens, as without a budget (a budget never changes a branch's seed).
#[test]
fn token_budget_stops_new_branches_and_keeps_the_rest_identical() {
    let model = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
    // One prompt at a time, so the budget is checked between forests as well.
    let options = |budget| RunOptions {
        token_budget: budget,
        max_concurrent_prompts: 1,
        ..RunOptions::new(AdvantageMode::Tree)
    };
    let (full, full_records, _) = run_with(&model, tree_config(true), 64, None, options(None));
    assert!(!full.budget_exhausted);
    let budget = full.tokens.computed / 3;
    let (cut, cut_records, computed) =
        run_with(&model, tree_config(true), 64, None, options(Some(budget)));
    assert!(cut.budget_exhausted);
    assert_eq!(cut.token_budget, Some(budget));
    assert!(
        cut.rollouts < full.rollouts,
        "{} vs {}",
        cut.rollouts,
        full.rollouts
    );
    assert!(cut.forests.iter().map(|f| f.skipped_branches).sum::<u64>() > 0);
    assert!(computed < full.tokens.computed);
    let key = |r: &TrajectoryRecord| {
        (
            r.prompt_uid.clone(),
            r.tree_id,
            r.trajectory.response_ids.clone(),
        )
    };
    let full_keys: std::collections::HashSet<_> = full_records.iter().map(key).collect();
    for r in &cut_records {
        assert!(full_keys.contains(&key(r)), "a budgeted branch differs");
    }
}
