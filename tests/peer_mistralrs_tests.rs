//! The peer engine (mistral.rs, feature `mistralrs`) on the default model: it runs the
//! chain workload of the search-QA task end to end and gives a decode speed. Smoke
//! tests only: the figures are printed for comparison, not checked against ours.
#![cfg(feature = "mistralrs")]

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use treegrpo::bench::decode_prompt;
use treegrpo::engine::Sampling;
use treegrpo::env::{load_samples, EnvConfig, Environment, SearchQaEnv, DEFAULT_TOP_K};
use treegrpo::model::LoadedModel;
use treegrpo::peer::{mistralrs_decode_tokens_per_second, run_mistralrs_chains, ChainWorkload};

/// The tests share the CPU: one at a time, so the speed figure is not halved.
static SERIAL: Mutex<()> = Mutex::new(());

fn data(f: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/multihop")
        .join(f)
}

#[test]
fn mistralrs_runs_the_chain_workload() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let path = common::default_model();
    let ours = Arc::new(LoadedModel::load(&path).unwrap());
    let env: Arc<dyn Environment> = Arc::new(
        SearchQaEnv::from_corpus_file(&data("corpus.jsonl"), DEFAULT_TOP_K, EnvConfig::default())
            .unwrap(),
    );
    let mut samples = load_samples(&data("train.jsonl")).unwrap();
    samples.truncate(2);
    let sampling = Sampling::Random {
        min_p: None,
        temperature: 1.0,
        top_k: None,
        top_p: None,
    };
    let workload = ChainWorkload::new(2, sampling, 32, 7);
    let s = common::runtime()
        .block_on(run_mistralrs_chains(&path, ours, env, samples, workload))
        .unwrap();
    eprintln!(
        "mistral.rs chains: {}",
        serde_json::to_string_pretty(&s).unwrap()
    );
    assert_eq!(s.prompts, 2);
    assert_eq!(s.rollouts, 4);
    assert!(s.prompt_tokens > 0);
    assert!(s.generated_tokens > 0);
    assert!(s.peer_completion_tokens > 0);
    assert!((0.0..=1.0).contains(&s.mean_reward), "{}", s.mean_reward);
    assert!(s.wall_seconds > 0.0 && s.rollouts_per_second > 0.0);
}

#[test]
fn mistralrs_decode_speed_is_positive() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let path = common::default_model();
    let prompt = decode_prompt(&LoadedModel::load(&path).unwrap()).unwrap();
    let tps = common::runtime()
        .block_on(mistralrs_decode_tokens_per_second(&path, &prompt, 2, 32))
        .unwrap();
    eprintln!("mistral.rs decode at batch 2: {tps:.1} tok/s");
    assert!(tps.is_finite() && tps > 0.0, "{tps}");
}

#[test]
fn peer_errors_instead_of_panicking() {
    let missing = Path::new("/nonexistent/model.gguf");
    let r = common::runtime().block_on(mistralrs_decode_tokens_per_second(missing, &[1, 2], 2, 8));
    assert!(r.is_err());
    let path = common::default_model();
    let r = common::runtime().block_on(mistralrs_decode_tokens_per_second(&path, &[1, 2], 0, 8));
    assert!(r.is_err());
    let r = common::runtime().block_on(mistralrs_decode_tokens_per_second(&path, &[], 2, 8));
    assert!(r.is_err());
}
