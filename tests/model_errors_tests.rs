//! Bad model input gets a clear error, never a panic or an abort.
//!
//! A user points `--model` at whatever file they have: half-downloaded, corrupt, of an
//! architecture we do not run, missing its tokenizer, or with weights that contradict
//! its config. Each case must come back as a [`ModelError`] of the right variant whose
//! message names the file at fault and the problem, so the user can act on it. Corrupt
//! length fields get special attention: a GGUF header that claims a 2^60-element array
//! (or a count that fits the file's size but not memory) must be rejected before anything
//! is allocated for it — an allocation failure aborts the process, which no caller can
//! catch. Fixtures are the default model cut short and tiny models the tests write
//! (`common::tiny`). The last test runs the real binary to check the user sees the
//! error line and exit status 1, not a panic.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::{DType, Device, Tensor};
use common::single_sequence::{generate, GenerateRequest};
use common::tiny::{write_gguf, Flavour, TinyModel};
use treegrpo::engine::{EngineError, Sampling, StopReason};
use treegrpo::model::{LoadedModel, ModelError};

fn load_err(path: &Path) -> ModelError {
    match LoadedModel::load(path) {
        Ok(_) => panic!("{} loaded but should not have", path.display()),
        Err(e) => e,
    }
}

/// The message and its causes, as a chain printer (the CLI's `{:#}`) shows them.
fn chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        msg.push_str(&format!(": {c}"));
        cause = c.source();
    }
    msg
}

/// The message (with its causes) names `file` and contains every one of `words`.
fn assert_message(err: &ModelError, file: &Path, words: &[&str]) {
    let msg = chain(err);
    assert!(
        msg.contains(&file.display().to_string()),
        "message does not name {}: {msg}",
        file.display()
    );
    for w in words {
        assert!(msg.contains(w), "message lacks {w:?}: {msg}");
    }
}

/// The first `len` bytes of the default model, in `dir`.
fn truncated_default(dir: &Path, len: u64, name: &str) -> PathBuf {
    let path = dir.join(name);
    let mut src = std::fs::File::open(common::default_model())
        .unwrap()
        .take(len);
    let mut dst = std::fs::File::create(&path).unwrap();
    assert_eq!(std::io::copy(&mut src, &mut dst).unwrap(), len);
    path
}

/// A GGUF v3 header: tensor and metadata counts, then `rest` verbatim.
fn header(tensors: u64, kvs: u64, rest: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(tensors.to_le_bytes());
    b.extend(kvs.to_le_bytes());
    b.extend_from_slice(rest);
    b
}

fn gguf_string(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

/// One metadata entry: an array of strings claiming `count` elements, whose first
/// string claims 2^62 bytes.
fn huge_string_array(count: u64) -> Vec<u8> {
    let mut b = gguf_string("tokenizer.ggml.tokens");
    b.extend(9u32.to_le_bytes()); // array
    b.extend(8u32.to_le_bytes()); // of strings
    b.extend(count.to_le_bytes());
    b.extend((1u64 << 62).to_le_bytes());
    b
}

#[test]
fn truncated_gguf_1kb() {
    let tmp = tempfile::tempdir().unwrap();
    let path = truncated_default(tmp.path(), 1024, "cut-1k.gguf");
    let err = load_err(&path);
    assert!(matches!(err, ModelError::CorruptGguf { .. }), "{err:?}");
    assert_message(&err, &path, &["truncated", "1024 bytes"]);
}

#[test]
fn truncated_gguf_50mb() {
    let tmp = tempfile::tempdir().unwrap();
    let path = truncated_default(tmp.path(), 50_000_000, "cut-50mb.gguf");
    let err = load_err(&path);
    assert!(matches!(err, ModelError::CorruptGguf { .. }), "{err:?}");
    // The header is intact; a tensor past the cut is what is missing.
    assert_message(&err, &path, &["truncated", "tensor '", "50000000 bytes"]);
}

#[test]
fn bad_magic() {
    let tmp = tempfile::tempdir().unwrap();
    let path = truncated_default(tmp.path(), 4096, "bad-magic.gguf");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..4].copy_from_slice(b"GGML");
    std::fs::write(&path, bytes).unwrap();
    let err = load_err(&path);
    assert!(matches!(err, ModelError::CorruptGguf { .. }), "{err:?}");
    assert_message(&err, &path, &["bad magic"]);
}

#[test]
fn array_length_2_pow_60() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("huge-array.gguf");
    std::fs::write(&path, header(0, 1, &huge_string_array(1 << 60))).unwrap();
    let err = load_err(&path);
    assert!(matches!(err, ModelError::CorruptGguf { .. }), "{err:?}");
    assert_message(&err, &path, &["truncated", "tokenizer.ggml.tokens"]);
}

/// Lengths that DO fit the file's size (a sparse 64 GiB file; no disk is used) but not
/// memory: 2^33 array elements or tensor entries are hundreds of GiB as Rust values, a
/// 32 GiB string is more than the test machine has. The reader must not reserve any of
/// that up front (a failed allocation aborts): it reads on and finds the first
/// element's own length impossible, or rejects the string length as corrupt.
#[test]
fn lengths_that_fit_the_file_but_not_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            "count-array.gguf",
            header(0, 1, &huge_string_array(1 << 33)),
            "truncated",
        ),
        (
            "count-tensors.gguf",
            header(1 << 33, 0, &(1u64 << 62).to_le_bytes()),
            "truncated",
        ),
        (
            "long-string.gguf",
            header(0, 1, &(1u64 << 35).to_le_bytes()),
            "corrupt length",
        ),
    ];
    for (name, bytes, problem) in cases {
        let path = tmp.path().join(name);
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&bytes).unwrap();
        f.set_len(1 << 36).unwrap();
        drop(f);
        let err = load_err(&path);
        assert!(matches!(err, ModelError::CorruptGguf { .. }), "{err:?}");
        assert_message(&err, &path, &[problem]);
    }
}

#[test]
fn unknown_architecture() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(Flavour::Llama, 1);
    let md: Vec<(String, Value)> = tiny
        .gguf_metadata()
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "general.architecture" => (k, Value::String("mamba".into())),
            _ => (k.replace("llama.", "mamba."), v),
        })
        .collect();
    let path = tmp.path().join("mamba.gguf");
    write_gguf(&path, &md, &tiny.gguf_tensors(true));
    let err = load_err(&path);
    assert!(
        matches!(&err, ModelError::UnsupportedArchitecture { arch, .. } if arch == "mamba"),
        "{err:?}"
    );
    assert_message(&err, &path, &["mamba", "llama"]);
}

#[test]
fn gguf_without_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(Flavour::Llama, 1);
    let md: Vec<(String, Value)> = tiny
        .gguf_metadata()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("tokenizer."))
        .collect();
    let path = tmp.path().join("no-tokenizer.gguf");
    write_gguf(&path, &md, &tiny.gguf_tensors(true));
    let err = load_err(&path);
    assert!(
        matches!(err, ModelError::MissingTokenizer { .. }),
        "{err:?}"
    );
    assert_message(&err, &path, &["tokenizer.ggml.model"]);
}

#[test]
fn hf_dir_without_tokenizer_json() {
    let tmp = tempfile::tempdir().unwrap();
    TinyModel::new(Flavour::Qwen2, 1).write_hf(tmp.path(), DType::F32, 1);
    let file = tmp.path().join("tokenizer.json");
    std::fs::remove_file(&file).unwrap();
    let err = load_err(tmp.path());
    assert!(
        matches!(err, ModelError::MissingTokenizer { .. }),
        "{err:?}"
    );
    assert_message(&err, &file, &["not found"]);
}

#[test]
fn hf_dir_without_config_json() {
    let tmp = tempfile::tempdir().unwrap();
    TinyModel::new(Flavour::Llama, 1).write_hf(tmp.path(), DType::F32, 1);
    let file = tmp.path().join("config.json");
    std::fs::remove_file(&file).unwrap();
    let err = load_err(tmp.path());
    assert!(matches!(err, ModelError::Config { .. }), "{err:?}");
    assert_message(&err, &file, &["not found"]);
}

/// A q weight of the wrong width: `[64, 32]` where hidden 64 implies `[64, 64]`.
fn tiny_with_bad_q(flavour: Flavour) -> TinyModel {
    let mut tiny = TinyModel::new(flavour, 1);
    let bad = Tensor::zeros((64, 32), DType::F32, &Device::Cpu).unwrap();
    tiny.set("model.layers.1.self_attn.q_proj.weight", bad);
    tiny
}

fn assert_shape_mismatch(err: &ModelError, file: &Path, tensor: &str) {
    match err {
        ModelError::ShapeMismatch {
            name,
            expected,
            found,
            ..
        } => {
            assert_eq!(name, tensor);
            assert_eq!(
                (expected.as_slice(), found.as_slice()),
                (&[64, 64][..], &[64, 32][..])
            );
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    assert_message(err, file, &[tensor, "[64, 32]", "[64, 64]"]);
}

#[test]
fn gguf_tensor_shape_contradicts_config() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bad-q.gguf");
    tiny_with_bad_q(Flavour::Llama).write_gguf(&path);
    assert_shape_mismatch(&load_err(&path), &path, "blk.1.attn_q.weight");
}

#[test]
fn hf_tensor_shape_contradicts_config() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_with_bad_q(Flavour::Qwen2).write_hf(tmp.path(), DType::F32, 1);
    let file = tmp.path().join("model.safetensors");
    let err = load_err(tmp.path());
    assert_shape_mismatch(&err, &file, "model.layers.1.self_attn.q_proj.weight");
}

/// A checkpoint behind `model.safetensors.index.json` (here with one shard): errors
/// name the index, not a `model.safetensors` that does not exist.
#[test]
fn hf_indexed_tensor_shape_contradicts_config() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_with_bad_q(Flavour::Llama).write_hf(tmp.path(), DType::F32, 1);
    let shard = "model-00001-of-00001.safetensors";
    std::fs::rename(tmp.path().join("model.safetensors"), tmp.path().join(shard)).unwrap();
    let index = tmp.path().join("model.safetensors.index.json");
    let map = serde_json::json!({ "weight_map": { "model.norm.weight": shard } });
    std::fs::write(&index, map.to_string()).unwrap();
    let err = load_err(tmp.path());
    assert_shape_mismatch(&err, &index, "model.layers.1.self_attn.q_proj.weight");
}

#[test]
fn hf_truncated_safetensors() {
    let tmp = tempfile::tempdir().unwrap();
    TinyModel::new(Flavour::Llama, 1).write_hf(tmp.path(), DType::F32, 1);
    let file = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_err(tmp.path());
    assert!(matches!(err, ModelError::Safetensors { .. }), "{err:?}");
    assert_message(&err, &file, &["safetensors"]);
}

#[test]
fn gguf_missing_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(Flavour::Llama, 1);
    let mut tensors = tiny.gguf_tensors(true);
    tensors.retain(|(n, _)| n != "blk.0.ffn_up.weight");
    let path = tmp.path().join("missing-up.gguf");
    write_gguf(&path, &tiny.gguf_metadata(), &tensors);
    let err = load_err(&path);
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err:?}");
    assert_message(&err, &path, &["blk.0.ffn_up.weight"]);
}

#[test]
fn nonexistent_path() {
    let path = Path::new("/nonexistent/dir/model.gguf");
    let err = load_err(path);
    assert!(matches!(err, ModelError::Io { .. }), "{err:?}");
    assert_message(&err, path, &["no such file"]);
}

#[test]
fn prompt_longer_than_context_window() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = TinyModel::new(Flavour::Llama, 1);
    let path = tmp.path().join("tiny.gguf");
    tiny.write_gguf(&path);
    let m = LoadedModel::load(&path).unwrap();
    assert_eq!(m.model.config().max_position_embeddings, tiny.context);
    let req = GenerateRequest {
        penalties: treegrpo::engine::Penalties::NONE,
        prompt: vec![40; tiny.context + 1],
        max_new_tokens: 4,
        sampling: Sampling::Greedy,
        seed: 0,
        stop_tokens: Vec::new(),
        prefill_chunk: 16,
    };
    let err = generate(&m.model, &req).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Model(ModelError::ContextOverflow {
                tokens: 65,
                max: 64
            })
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("65") && msg.contains("64"), "{msg}");
    // One token short of the window still generates one token, then stops: full.
    let ok = GenerateRequest {
        penalties: treegrpo::engine::Penalties::NONE,
        prompt: vec![40; tiny.context - 1],
        ..req
    };
    let out = generate(&m.model, &ok).unwrap();
    assert_eq!((out.tokens.len(), out.stop), (1, StopReason::ContextFull));

    // The caller's other mistakes are variants of their own, as through the engine.
    let empty = GenerateRequest {
        penalties: treegrpo::engine::Penalties::NONE,
        prompt: Vec::new(),
        ..ok.clone()
    };
    let err = generate(&m.model, &empty).unwrap_err();
    assert!(matches!(err, EngineError::EmptyPrompt), "{err:?}");
    let vocab = m.model.config().vocab_size;
    let oov = GenerateRequest {
        penalties: treegrpo::engine::Penalties::NONE,
        prompt: vec![40, vocab as u32 + 3],
        ..ok
    };
    let err = generate(&m.model, &oov).unwrap_err();
    assert!(
        matches!(err, EngineError::BadToken { token, vocab: v } if token == vocab as u32 + 3 && v == vocab),
        "{err:?}"
    );
}

#[test]
fn binary_reports_truncated_gguf_and_exits_1() {
    let tmp = tempfile::tempdir().unwrap();
    let path = truncated_default(tmp.path(), 1024, "cut-for-cli.gguf");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_treegrpo"))
        .args(["generate", "--model"])
        .arg(&path)
        .args(["--prompt", "hi"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(stderr.contains("truncated"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.stdout.is_empty());
}
