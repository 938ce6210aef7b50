//! Tree rollouts on the default model and the search-QA task: nothing is computed
//! twice, trees have the expected shape, and a seed fixes the output bytes.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use treegrpo::advantage::AdvantageMode;
use treegrpo::engine::{Engine, EngineConfig, Sampling};
use treegrpo::env::{load_samples, EnvConfig, Environment, SearchQaEnv, DEFAULT_TOP_K};
use treegrpo::model::LoadedModel;
use treegrpo::rollout::{run_rollout, Output, RunSummary, Selection, TreeConfig};

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
    let (summary, _) = rt
        .block_on(run_rollout(
            engine,
            env,
            samples,
            cfg,
            AdvantageMode::Tree,
            output,
            &mut |_| {},
        ))
        .unwrap();
    summary
}

#[test]
fn tree_rollouts_compute_no_token_twice_and_have_one_plus_nl_leaves() {
    let model = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let s = run(&model, tree_config(true), 64, Some(dir.path()));
    assert_eq!(s.tokens.recomputed, 0);
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
    // (Prompts share the system prompt: its full blocks come from the prefix cache.)
    assert_eq!(
        s.tokens.prompt_prefilled + s.tokens.reused_prefix_cache,
        prompt_tokens
    );
    assert!(s.tokens.reused_prefix_cache > 0);
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
    run(&model, tree_config(true), 3, Some(b.path()));
    let fa = std::fs::read(a.path().join("trajectories.jsonl")).unwrap();
    let fb = std::fs::read(b.path().join("trajectories.jsonl")).unwrap();
    assert!(!fa.is_empty());
    assert!(
        fa == fb,
        "trajectories.jsonl differs between batch caps 64 and 3"
    );
}
