//! The JSONL readers of files a user or a trainer hands us: questions, a corpus,
//! `forest.jsonl`, `trajectories.jsonl`. The first byte picks the reader; every input
//! is a typed error naming the line, or data, never a panic.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use treegrpo::model::ModelConfig;

fn model_config() -> ModelConfig {
    serde_json::from_value(serde_json::json!({
        "architecture": "llama", "vocab_size": 300, "hidden_size": 16,
        "intermediate_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
        "head_dim": 4, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_style": "HalfSplit", "tie_word_embeddings": true
    }))
    .expect("the fuzz target's model config")
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let path = Path::new("fuzz.jsonl");
    let text = String::from_utf8_lossy(rest);
    match which % 4 {
        0 => drop(treegrpo::env::sample::parse_samples(&text, path)),
        1 => drop(treegrpo::env::Corpus::parse_jsonl(&text, path)),
        2 => drop(treegrpo::rollout::parse_forest(rest, path)),
        _ => drop(treegrpo::train::input::parse_trajectories(
            &text,
            path,
            &model_config(),
        )),
    }
});
