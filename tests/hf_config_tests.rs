//! HF checkpoints as transformers 5 writes them: RoPE under `rope_parameters`, the
//! chat template in `chat_template.jinja`, Llama 3.1's `llama3` frequency scaling —
//! and any other `rope_type` refused, never served as plain RoPE.
//!
//! The trap this guards: a loader that reads only a top-level `rope_theta` falls back
//! to 10,000 on a transformers-5 Qwen2 (θ = 1e6) and serves plausible, wrong logits.
//! So each layout is compared with the same weights under the older layout (same
//! arithmetic: logits equal bit for bit), and with the wrong θ (clearly different:
//! the comparison would catch the fallback).

mod common;

use std::path::Path;

use candle_core::DType;
use common::max_abs_diff;
use common::tiny::{logits_all, Flavour, TinyModel};
use serde_json::{json, Value};
use treegrpo::model::{ChatMessage, LoadedModel, ModelError, RopeScaling};

/// Writes `tiny` as an HF folder, then rewrites its `config.json` by `edit`.
fn write_with_config(tiny: &TinyModel, dir: &Path, edit: impl FnOnce(&mut Value)) {
    tiny.write_hf(dir, DType::F32, 1);
    let mut config = tiny.config_json();
    edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

fn load(dir: &Path) -> LoadedModel {
    LoadedModel::load(dir).unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
}

/// Max |Δlogit| over every position of a 40-token sequence.
fn worst_diff(a: &LoadedModel, b: &LoadedModel) -> f32 {
    let vocab = a.model.config().vocab_size as u32;
    let seq: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % vocab).collect();
    logits_all(a, &seq)
        .iter()
        .zip(&logits_all(b, &seq))
        .map(|(x, y)| max_abs_diff(x, y))
        .fold(0.0, f32::max)
}

#[test]
fn transformers_5_rope_parameters_give_theta_one_million() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(Flavour::Qwen2, 3);
    assert_eq!(tiny.rope_theta, 1e6);
    let (old, new, wrong) = (
        tmp.path().join("old"),
        tmp.path().join("new"),
        tmp.path().join("wrong"),
    );
    write_with_config(&tiny, &old, |_| {});
    write_with_config(&tiny, &new, |c| {
        let o = c.as_object_mut().unwrap();
        o.remove("rope_theta");
        o.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 1_000_000.0}),
        );
    });
    write_with_config(&tiny, &wrong, |c| c["rope_theta"] = json!(10_000.0));
    let (old, new, wrong) = (load(&old), load(&new), load(&wrong));
    assert_eq!(new.model.config().rope_theta, 1e6);
    assert_eq!(new.model.config().rope_scaling, RopeScaling::Default);
    assert_eq!(worst_diff(&old, &new), 0.0);
    assert!(
        worst_diff(&old, &wrong) > 1e-2,
        "θ must matter on these positions"
    );
}

#[test]
fn unsupported_rope_types_and_conflicts_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(Flavour::Qwen2, 3);
    let cases = [
        (
            "yarn",
            json!({"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
            "rope_type 'yarn' is not supported",
        ),
        (
            "dynamic",
            json!({"rope_type": "dynamic", "rope_theta": 1e6, "factor": 2.0}),
            "rope_type 'dynamic' is not supported",
        ),
        (
            "conflict",
            json!({"rope_type": "default", "rope_theta": 5e5}),
            "rope_theta is 1000000 at the top level but 500000 in rope_parameters",
        ),
    ];
    for (name, params, expected) in cases {
        let dir = tmp.path().join(name);
        write_with_config(&tiny, &dir, |c| c["rope_parameters"] = params);
        let err = LoadedModel::load(&dir).unwrap_err();
        assert!(matches!(err, ModelError::Rope { .. }), "{name}: {err}");
        let text = err.to_string();
        assert!(text.contains(expected), "{name}: {text}");
        assert!(text.contains("config.json"), "names the file: {text}");
    }
    // transformers 4's spelling of the same refusal.
    let dir = tmp.path().join("linear");
    write_with_config(&tiny, &dir, |c| {
        c["rope_scaling"] = json!({"type": "linear", "factor": 2.0})
    });
    let err = LoadedModel::load(&dir).unwrap_err().to_string();
    assert!(err.contains("rope_type 'linear' is not supported"), "{err}");
}

/// Llama 3.1's scaling, with an original context short enough that this tiny model's
/// frequencies fall in all three bands: read from either spelling, applied (logits
/// differ from plain RoPE beyond position 0, equal at it), and written back by our
/// checkpoints in both spellings.
#[test]
fn llama3_scaling_is_read_applied_and_written_back() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(Flavour::Llama, 5);
    let scaling = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
    let (v4, v5, plain) = (
        tmp.path().join("v4"),
        tmp.path().join("v5"),
        tmp.path().join("plain"),
    );
    write_with_config(&tiny, &v4, |c| c["rope_scaling"] = scaling.clone());
    write_with_config(&tiny, &v5, |c| {
        let mut p = scaling.clone();
        p["rope_theta"] = c["rope_theta"].clone();
        c.as_object_mut().unwrap().remove("rope_theta");
        c["rope_parameters"] = p;
    });
    write_with_config(&tiny, &plain, |_| {});
    let (v4, v5, plain) = (load(&v4), load(&v5), load(&plain));
    let want = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 64,
    };
    assert_eq!(v4.model.config().rope_scaling, want);
    assert_eq!(v5.model.config(), v4.model.config());
    assert_eq!(worst_diff(&v4, &v5), 0.0);
    assert!(
        worst_diff(&v4, &plain) > 1e-3,
        "scaling must change the logits"
    );
    let first = |m: &LoadedModel| logits_all(m, &[7]).remove(0);
    assert_eq!(
        first(&v4),
        first(&plain),
        "position 0 is not rotated: equal"
    );

    // Our checkpoint of the scaled model reads back with the same RoPE.
    let saved = tmp.path().join("saved");
    let params = treegrpo::train::Params::from_model(&v4.model, DType::F32).unwrap();
    treegrpo::train::save_checkpoint(
        &saved,
        &params,
        treegrpo::train::CheckpointExtras {
            tokenizer: &v4.tokenizer,
            chat_template: v4.chat_template.as_ref(),
            optimizer: None,
            loop_state: None,
        },
    )
    .unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(saved.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["rope_parameters"]["rope_type"], "llama3");
    assert_eq!(config["rope_scaling"]["rope_type"], "llama3");
    let back = load(&saved);
    assert_eq!(back.model.config().rope_scaling, want);
    assert_eq!(worst_diff(&v4, &back), 0.0);
}

#[test]
fn chat_template_jinja_is_read_and_wins_over_the_config() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(Flavour::Qwen2, 3);
    let dir = tmp.path().join("m");
    write_with_config(&tiny, &dir, |_| {});
    let messages = [ChatMessage::new("user", "hi")];
    let from_config = load(&dir).chat_prompt(&messages).unwrap();
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}",
    )
    .unwrap();
    let rendered = |m: &LoadedModel| {
        m.tokenizer
            .decode(&m.chat_prompt(&messages).unwrap())
            .unwrap()
    };
    // Beside the config's template, the file wins (as in transformers).
    let m = load(&dir);
    assert_eq!(rendered(&m), "[user] hi\n");
    assert_ne!(m.chat_prompt(&messages).unwrap(), from_config);
    // transformers 5 writes no template into tokenizer_config.json at all.
    let tok_config = dir.join("tokenizer_config.json");
    let mut tc: Value =
        serde_json::from_str(&std::fs::read_to_string(&tok_config).unwrap()).unwrap();
    tc.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&tok_config, tc.to_string()).unwrap();
    assert_eq!(rendered(&load(&dir)), "[user] hi\n");
}
