//! The HF safetensors loader and the GGUF loader agree: the same weights, written once
//! as an HF directory and once as a llama.cpp-style GGUF, give the same logits.
//!
//! Each test builds a tiny model itself (seeded random weights; hidden 64, 2 layers,
//! 4 heads, 2 KV heads, a 283-token byte-level BPE vocabulary) in two flavours:
//! llama (no biases, tied embeddings) and qwen2 (q/k/v biases, untied `lm_head`,
//! rope_theta 1e6). The GGUF copy uses llama.cpp names and, for llama only, Q and K
//! permuted exactly as `convert_hf_to_gguf.py` does, because llama.cpp runs llama RoPE
//! on adjacent pairs and qwen2 on half-split pairs. That permutation is the classic trap:
//! get the pairing wrong and the logits are plausible but wrong, and only positions > 0
//! show it. So besides agreement (every position of several sequences, within 1e-4 —
//! both sides are f32, they differ only in summation order) we check that an
//! UNpermuted llama GGUF gives clearly different logits, which proves the comparison
//! would catch the trap.
//!
//! Also covered: a state dict in HF layout served where a llama GGUF was (as
//! `Engine.load_state_dict` does) computes the HF logits; bf16 and f16 checkpoints
//! (logits within a stated tolerance of f32),
//! a checkpoint sharded over two files with `model.safetensors.index.json`, and that
//! the HF `tokenizer.json` and the GGUF tokenizer metadata tokenise and template alike.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Tensor};
use common::max_abs_diff;
use common::tiny::{logits_all, write_gguf, Flavour, TinyModel};
use treegrpo::model::{ChatMessage, LoadedModel, Model, RopeStyle};

/// Same f32 weights, different summation order only.
const F32_TOLERANCE: f32 = 1e-4;

/// Token sequences: a chat prompt, a few fixed ones and the whole context window.
fn sequences(m: &LoadedModel, context: usize) -> Vec<Vec<u32>> {
    let chat = m
        .chat_prompt(&[ChatMessage::new("user", "hello there, is the tin in?")])
        .unwrap();
    let vocab = m.model.config().vocab_size as u32;
    let full: Vec<u32> = (0..context as u32).map(|i| (i * 37 + 11) % vocab).collect();
    vec![chat, vec![5], vec![3, 100, 7, 7, 7, 250, 1, 2], full]
}

/// Max |Δlogit| over every position of every sequence.
fn worst_diff(a: &LoadedModel, b: &LoadedModel, context: usize) -> f32 {
    let mut worst = 0f32;
    for seq in sequences(a, context) {
        let (la, lb) = (logits_all(a, &seq), logits_all(b, &seq));
        assert_eq!(la.len(), seq.len());
        assert_eq!(lb.len(), seq.len());
        for (ra, rb) in la.iter().zip(&lb) {
            worst = worst.max(max_abs_diff(ra, rb));
        }
    }
    worst
}

/// Largest |logit| the model produces on the test sequences, to scale tolerances.
fn logit_scale(m: &LoadedModel, context: usize) -> f32 {
    sequences(m, context)
        .iter()
        .flat_map(|s| logits_all(m, s))
        .flatten()
        .fold(0f32, |a, x| a.max(x.abs()))
}

fn load(path: &Path) -> LoadedModel {
    LoadedModel::load(path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// Writes the model as an f32 HF directory and as a GGUF; loads both.
fn hf_and_gguf(tiny: &TinyModel, dir: &Path) -> (LoadedModel, LoadedModel) {
    let hf_dir = dir.join("hf");
    tiny.write_hf(&hf_dir, DType::F32, 1);
    let gguf = dir.join(format!("{}.gguf", tiny.arch()));
    tiny.write_gguf(&gguf);
    (load(&hf_dir), load(&gguf))
}

fn gguf_matches_hf(flavour: Flavour) {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(flavour, 7);
    let (hf, gguf) = hf_and_gguf(&tiny, tmp.path());
    assert_eq!(hf.model.config().rope_style, RopeStyle::HalfSplit);
    let (c_hf, c_gguf) = (hf.model.config(), gguf.model.config());
    assert_eq!(c_hf.vocab_size, tiny.vocab.tokens.len());
    assert_eq!(c_hf.tie_word_embeddings, flavour == Flavour::Llama);
    assert_eq!(c_gguf.tie_word_embeddings, flavour == Flavour::Llama);
    assert_eq!(c_hf.rope_theta, c_gguf.rope_theta);
    assert_eq!(c_hf.num_kv_heads, 2);
    let d = worst_diff(&hf, &gguf, tiny.context);
    eprintln!("{flavour:?}: worst |Δlogit| HF vs GGUF = {d:e}");
    assert!(d <= F32_TOLERANCE, "{flavour:?}: HF vs GGUF differ by {d}");
}

#[test]
fn llama_gguf_matches_hf_at_every_position() {
    gguf_matches_hf(Flavour::Llama);
}

#[test]
fn qwen2_gguf_matches_hf_at_every_position() {
    gguf_matches_hf(Flavour::Qwen2);
}

/// The trap: a llama GGUF whose Q/K were NOT permuted loads fine but computes RoPE on
/// the wrong dimension pairs. Position 0 is unaffected (no rotation), later ones are not.
#[test]
fn unpermuted_llama_gguf_gives_different_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(Flavour::Llama, 7);
    let (hf, _) = hf_and_gguf(&tiny, tmp.path());
    let bad_path = tmp.path().join("unpermuted.gguf");
    write_gguf(&bad_path, &tiny.gguf_metadata(), &tiny.gguf_tensors(false));
    let bad = load(&bad_path);
    let seq: Vec<u32> = vec![40, 41, 42, 43, 44, 45, 46, 47];
    let (good, wrong) = (logits_all(&hf, &seq), logits_all(&bad, &seq));
    assert!(
        max_abs_diff(&good[0], &wrong[0]) <= F32_TOLERANCE,
        "position 0 has no rotation, so it must agree"
    );
    let d = worst_diff(&hf, &bad, tiny.context);
    eprintln!("unpermuted: worst |Δlogit| = {d}");
    assert!(d > 0.1, "unpermuted GGUF should differ clearly, got {d}");
}

/// A trainer's state dict (HF names, HF layout) served where a llama GGUF was (its
/// config pairs RoPE dimensions as llama.cpp's permuted Q/K rows need) computes the HF
/// checkpoint's logits: `Model::from_hf_state_dict` pairs them as HF does.
#[test]
fn an_hf_state_dict_in_place_of_a_llama_gguf_computes_the_hf_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(Flavour::Llama, 7);
    let (hf, mut gguf) = hf_and_gguf(&tiny, tmp.path());
    assert_eq!(gguf.model.config().rope_style, RopeStyle::Interleaved);
    let tensors: HashMap<String, Tensor> = tiny.tensors.iter().cloned().collect();
    let served = Model::from_hf_state_dict(
        gguf.model.config().clone(),
        tensors,
        Path::new("<state dict>"),
    )
    .unwrap();
    gguf.model = Arc::new(served);
    let d = worst_diff(&hf, &gguf, tiny.context);
    eprintln!("state dict on the GGUF's config vs HF: worst |Δlogit| = {d:e}");
    assert!(d <= F32_TOLERANCE, "differ by {d}");
}

/// Half-precision checkpoints keep their bf16/f16 weights (widened exactly as the
/// kernels read them). Rounding every weight to bf16
/// (8 significant bits, relative error ≤ 2^-9) or f16 (11 bits, ≤ 2^-12) perturbs the
/// logits; through two layers we accept 1% (bf16) and 0.25% (f16) of the largest
/// |logit|, 3-5 times the error measured here (0.34%, 0.05%) but far below the effect of a wrong
/// conversion (a byte-order or bf16/f16 mix-up changes logits by more than their scale).
#[test]
fn bf16_and_f16_checkpoints_match_f32() {
    for flavour in [Flavour::Llama, Flavour::Qwen2] {
        let tmp = tempfile::tempdir().unwrap();
        let tiny = TinyModel::new(flavour, 11);
        tiny.write_hf(&tmp.path().join("f32"), DType::F32, 1);
        let f32_model = load(&tmp.path().join("f32"));
        let scale = logit_scale(&f32_model, tiny.context);
        for (dtype, rel) in [(DType::BF16, 0.01), (DType::F16, 0.0025)] {
            let dir = tmp.path().join(format!("{dtype:?}"));
            tiny.write_hf(&dir, dtype, 1);
            let d = worst_diff(&f32_model, &load(&dir), tiny.context);
            eprintln!("{flavour:?} {dtype:?}: worst |Δlogit| = {d} (scale {scale})");
            assert!(
                d <= rel * scale,
                "{flavour:?} {dtype:?}: |Δlogit| {d} > {rel} × {scale}"
            );
            assert!(d > 0.0, "{dtype:?} rounding should change something");
        }
    }
}

/// A checkpoint split over two shards with an index loads to the same model.
#[test]
fn sharded_checkpoint_matches_single_file() {
    for flavour in [Flavour::Llama, Flavour::Qwen2] {
        let tmp = tempfile::tempdir().unwrap();
        let tiny = TinyModel::new(flavour, 3);
        tiny.write_hf(&tmp.path().join("single"), DType::F32, 1);
        let sharded = tmp.path().join("sharded");
        tiny.write_hf(&sharded, DType::F32, 2);
        assert!(!sharded.join("model.safetensors").exists());
        assert!(sharded.join("model-00002-of-00002.safetensors").exists());
        let single = load(&tmp.path().join("single"));
        let d = worst_diff(&single, &load(&sharded), tiny.context);
        assert_eq!(d, 0.0, "{flavour:?}: sharded load differs by {d}");
    }
}

/// `tokenizer.json` (through `tokenizers`) and the GGUF metadata (our BPE) are the same
/// tokenizer, and both loaders render the same ChatML template.
#[test]
fn hf_and_gguf_tokenizers_and_templates_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(Flavour::Qwen2, 5);
    let (hf, gguf) = hf_and_gguf(&tiny, tmp.path());
    for text in [
        "hello there",
        "  the tin is in\n\n the well  ",
        "<|im_start|>user\nhell o 123<|im_end|>",
        "naïve 日本 😀",
        "",
    ] {
        let a = hf.tokenizer.encode(text, true).unwrap();
        let b = gguf.tokenizer.encode(text, true).unwrap();
        assert_eq!(a, b, "{text:?}");
        assert_eq!(hf.tokenizer.decode(&a).unwrap(), text);
        assert_eq!(gguf.tokenizer.decode(&b).unwrap(), text);
    }
    // Merges fire: "hello" is one token, " the" is one token.
    assert_eq!(hf.tokenizer.encode("hello the", true).unwrap().len(), 2);
    assert_eq!(hf.tokenizer.eos_ids(), gguf.tokenizer.eos_ids());
    let msgs = [ChatMessage::new("user", "hi")];
    let a = hf
        .chat_template
        .as_ref()
        .unwrap()
        .render(&msgs, true)
        .unwrap();
    let b = gguf
        .chat_template
        .as_ref()
        .unwrap()
        .render(&msgs, true)
        .unwrap();
    assert_eq!(a, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(a, b);
    assert_eq!(
        hf.chat_prompt(&msgs).unwrap(),
        gguf.chat_prompt(&msgs).unwrap()
    );
}
