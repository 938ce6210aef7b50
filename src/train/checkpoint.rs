//! Checkpoints in HF layout: `config.json`, `model.safetensors` (f32), `tokenizer.json`,
//! `tokenizer_config.json` (with the chat template) — a directory `--model` loads
//! anywhere in the product — plus the optimiser's state beside them
//! (`optimizer.safetensors`, `trainer_state.json`) and, for the training loop, its
//! own state (`loop_state.json`).
//!
//! Llama GGUF files store Q and K rows permuted for llama.cpp's interleaved RoPE; a
//! checkpoint is HF's half-split layout, so those rows are un-permuted on the way out
//! (the checkpoint test compares logits of the reloaded directory with the source).
//!
//! A save never leaves a half-written checkpoint where the previous one was: the files
//! go to `<dir>.partial`, which is then swapped in by renames (`<dir>` →
//! `<dir>.previous`, `<dir>.partial` → `<dir>`, then `<dir>.previous` is removed). A
//! crash while writing leaves `<dir>` untouched; the next save clears the leftovers.
//! A crash between the two renames leaves no `<dir>` but a whole `<dir>.previous`:
//! [`recover_interrupted_save`] (called by every save, and by a resume before it
//! looks) puts it back. Every file, and the folders, are synced to disk before the
//! renames, so a power cut cannot swap in a checkpoint whose data never reached it.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::error::TrainError;
use super::optim::{Optimizer, OptimizerConfig};
use super::params::Params;
use crate::durable;
use crate::model::{Architecture, ChatTemplate, ModelConfig, RopeStyle, Tokenizer};

/// What a checkpoint carries besides the weights.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointExtras<'a> {
    /// Written as `tokenizer.json` and `tokenizer_config.json`, so the directory loads
    /// as a model on its own.
    pub tokenizer: &'a Tokenizer,
    /// The chat template recorded in `tokenizer_config.json`; `None` writes no template.
    pub chat_template: Option<&'a ChatTemplate>,
    /// The optimiser to save beside the weights: its step and config go to
    /// `trainer_state.json`, its moments (if it has any yet) to
    /// `optimizer.safetensors`. `None` writes neither, and a later resume starts a
    /// fresh optimiser.
    pub optimizer: Option<&'a Optimizer>,
    /// A caller's own state, saved as `loop_state.json` in the same atomic swap (the
    /// training loop's step and token count).
    pub loop_state: Option<&'a serde_json::Value>,
}

/// `trainer_state.json`.
#[derive(Debug, Serialize, Deserialize)]
struct TrainerState {
    step: u64,
    optimizer: OptimizerConfig,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |e| TrainError::Io(path.to_path_buf(), e)
}

/// HF's `config.json` for `c`.
fn hf_config(c: &ModelConfig, tokenizer: &Tokenizer) -> serde_json::Value {
    let (arch, model_type) = match c.architecture {
        Architecture::Llama => ("LlamaForCausalLM", "llama"),
        Architecture::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
    };
    serde_json::json!({
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        // Both spellings: transformers 4 reads `rope_theta` / `rope_scaling`,
        // transformers 5 `rope_parameters`.
        "rope_theta": c.rope_theta,
        "rope_scaling": match c.rope_scaling {
            crate::model::RopeScaling::Default => serde_json::Value::Null,
            ref s => serde_json::to_value(s).unwrap_or_default(),
        },
        "rope_parameters": crate::model::rope::to_hf_parameters(c.rope_theta, &c.rope_scaling),
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "bos_token_id": tokenizer.bos(),
        "eos_token_id": tokenizer.eos_ids().first(),
    })
}

/// Undoes llama.cpp's Q/K permutation: rows `(head, j, pair)` of the interleaved layout
/// become `(head, pair, j)` of HF's half-split one.
fn unpermute(w: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    let half = rows / heads / 2;
    w.reshape((heads, half, 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))
}

/// llama.cpp's Q/K permutation, the inverse of [`unpermute`]: rows `(head, pair, j)`
/// of HF's half-split layout become `(head, j, pair)` of the interleaved one.
fn permute(w: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    let half = rows / heads / 2;
    w.reshape((heads, 2, half, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))
}

/// The KV heads a Q or K weight (or bias) of this name is split into; `None` for
/// every other tensor.
fn rope_heads(c: &ModelConfig, name: &str) -> Option<usize> {
    if name.ends_with("q_proj.weight") || name.ends_with("q_proj.bias") {
        Some(c.num_heads)
    } else if name.ends_with("k_proj.weight") || name.ends_with("k_proj.bias") {
        Some(c.num_kv_heads)
    } else {
        None
    }
}

/// Applies a row permutation to a matrix or a bias vector.
fn on_rows(
    t: &Tensor,
    heads: usize,
    f: fn(&Tensor, usize) -> candle_core::Result<Tensor>,
) -> candle_core::Result<Tensor> {
    if t.rank() == 1 {
        f(&t.unsqueeze(1)?, heads)?.squeeze(1)
    } else {
        f(t, heads)
    }
}

/// Sets every weight of `params` to the checkpoint's in `dir`, in `params`'s own
/// RoPE layout (a llama GGUF source's Q/K rows are permuted back), so a run resumed
/// from a checkpoint holds bit-for-bit the weights it saved. Shapes must match.
pub fn restore_weights(dir: &Path, params: &Params) -> Result<(), TrainError> {
    let path = dir.join("model.safetensors");
    let tensors = candle_core::safetensors::load(&path, &Device::Cpu).map_err(|source| {
        TrainError::Safetensors {
            path: path.clone(),
            source,
        }
    })?;
    let c = &params.config;
    for (name, var) in params.named() {
        let t = tensors
            .get(&name)
            .ok_or_else(|| bad_checkpoint(&path, format!("no tensor {name}")))?;
        if t.dims() != var.dims() {
            return Err(bad_checkpoint(
                &path,
                format!("{name} is {:?}, the model's is {:?}", t.dims(), var.dims()),
            ));
        }
        let mut t = t.to_dtype(var.dtype())?;
        if c.rope_style == RopeStyle::Interleaved {
            if let Some(h) = rope_heads(c, &name) {
                t = on_rows(&t, h, permute)?;
            }
        }
        var.set(&t)?;
    }
    Ok(())
}

fn bad_checkpoint(path: &Path, message: String) -> TrainError {
    TrainError::BadInput {
        path: path.to_path_buf(),
        line: 0,
        message,
    }
}

/// The weights as HF tensors (f32, half-split RoPE layout).
fn hf_tensors(params: &Params) -> Result<HashMap<String, Tensor>, TrainError> {
    let c = &params.config;
    let mut out = HashMap::new();
    for (name, var) in params.named() {
        let mut t = var.as_tensor().detach().to_dtype(DType::F32)?;
        if c.rope_style == RopeStyle::Interleaved {
            if let Some(h) = rope_heads(c, &name) {
                t = on_rows(&t, h, unpermute)?;
            }
        }
        out.insert(name, t);
    }
    Ok(out)
}

/// The checkpoint's files, in the order they are written.
const FILES: [&str; 7] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors",
    "optimizer.safetensors",
    "trainer_state.json",
    "loop_state.json",
];

fn write_files(
    dir: &Path,
    params: &Params,
    extras: CheckpointExtras<'_>,
    stop_after: Option<usize>,
) -> Result<(), TrainError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    for (i, file) in FILES.iter().enumerate() {
        if stop_after == Some(i) {
            return Err(TrainError::Io(
                dir.join(file),
                std::io::Error::other("save stopped here (simulated crash)"),
            ));
        }
        let path = dir.join(file);
        match *file {
            "config.json" => {
                let text =
                    serde_json::to_string_pretty(&hf_config(&params.config, extras.tokenizer))
                        .expect("a JSON value serialises");
                std::fs::write(&path, text).map_err(io(&path))?;
            }
            "tokenizer.json" => {
                std::fs::write(&path, extras.tokenizer.to_hf_json()?).map_err(io(&path))?;
            }
            "tokenizer_config.json" => {
                let c = extras
                    .tokenizer
                    .hf_config_json(extras.chat_template.map(ChatTemplate::source));
                std::fs::write(&path, serde_json::to_string_pretty(&c).expect("JSON"))
                    .map_err(io(&path))?;
            }
            "model.safetensors" => {
                candle_core::safetensors::save(&hf_tensors(params)?, &path)?;
            }
            "optimizer.safetensors" => {
                let Some(opt) = extras.optimizer.filter(|o| !o.moments.is_empty()) else {
                    continue;
                };
                let mut t = HashMap::new();
                for ((name, _), (m, v)) in params.named().iter().zip(&opt.moments) {
                    t.insert(format!("exp_avg.{name}"), m.clone());
                    t.insert(format!("exp_avg_sq.{name}"), v.clone());
                }
                candle_core::safetensors::save(&t, &path)?;
            }
            "trainer_state.json" => {
                let Some(opt) = extras.optimizer else {
                    continue;
                };
                let state = TrainerState {
                    step: opt.step,
                    optimizer: opt.config,
                };
                std::fs::write(&path, serde_json::to_string_pretty(&state).expect("JSON"))
                    .map_err(io(&path))?;
            }
            "loop_state.json" => {
                let Some(state) = extras.loop_state else {
                    continue;
                };
                std::fs::write(&path, serde_json::to_string_pretty(state).expect("JSON"))
                    .map_err(io(&path))?;
            }
            _ => unreachable!("every file is written above"),
        }
        durable::sync(&path).map_err(io(&path))?;
    }
    Ok(())
}

/// Writes a checkpoint of `params` to `dir`, replacing what was there only once the
/// new one is whole.
pub fn save_checkpoint(
    dir: &Path,
    params: &Params,
    extras: CheckpointExtras<'_>,
) -> Result<(), TrainError> {
    save_checkpoint_stopping_after(dir, params, extras, None)
}

/// [`save_checkpoint`] that stops, as a crash would, before writing file `stop_after`
/// (for the test that an interrupted save leaves the previous checkpoint whole).
#[doc(hidden)]
pub fn save_checkpoint_stopping_after(
    dir: &Path,
    params: &Params,
    extras: CheckpointExtras<'_>,
    stop_after: Option<usize>,
) -> Result<(), TrainError> {
    let partial = durable::partial(dir);
    let previous = durable::previous(dir);
    recover_interrupted_save(dir)?;
    write_files(&partial, params, extras, stop_after)?;
    durable::sync(&partial).map_err(io(&partial))?;
    if dir.exists() {
        if previous.exists() {
            std::fs::remove_dir_all(&previous).map_err(io(&previous))?;
        }
        std::fs::rename(dir, &previous).map_err(io(dir))?;
    }
    std::fs::rename(&partial, dir).map_err(io(dir))?;
    durable::sync_parent(dir).map_err(io(dir))?;
    if previous.exists() {
        std::fs::remove_dir_all(&previous).map_err(io(&previous))?;
    }
    Ok(())
}

/// Undoes what an interrupted [`save_checkpoint`] of `dir` left: a `<dir>.partial`
/// (never swapped in, so possibly half-written) is removed, and a `<dir>.previous`
/// without a `<dir>` (the crash fell between the two renames) becomes `<dir>` again.
/// Returns whether it put a checkpoint back.
pub fn recover_interrupted_save(dir: &Path) -> Result<bool, TrainError> {
    let partial = durable::partial(dir);
    let previous = durable::previous(dir);
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io(&partial))?;
    }
    if previous.exists() && !dir.exists() {
        std::fs::rename(&previous, dir).map_err(io(dir))?;
        durable::sync_parent(dir).map_err(io(dir))?;
        return Ok(true);
    }
    Ok(false)
}

/// The optimiser state saved beside a checkpoint of `params`, if there is one.
pub fn load_optimizer(dir: &Path, params: &Params) -> Result<Option<Optimizer>, TrainError> {
    let state_path = dir.join("trainer_state.json");
    if !state_path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&state_path).map_err(io(&state_path))?;
    let state: TrainerState = serde_json::from_str(&text).map_err(|source| TrainError::Json {
        path: state_path.clone(),
        line: 0,
        what: "a trainer state",
        source,
    })?;
    let mut opt = Optimizer::new(state.optimizer);
    opt.step = state.step;
    let moments_path = dir.join("optimizer.safetensors");
    if moments_path.exists() {
        let t = candle_core::safetensors::load(&moments_path, &Device::Cpu)?;
        for (name, var) in params.named() {
            let get = |k: String| {
                t.get(&k).cloned().ok_or_else(|| TrainError::BadInput {
                    path: moments_path.clone(),
                    line: 0,
                    message: format!("no {k}"),
                })
            };
            let m = get(format!("exp_avg.{name}"))?.to_dtype(var.dtype())?;
            let v = get(format!("exp_avg_sq.{name}"))?.to_dtype(var.dtype())?;
            opt.moments.push((m, v));
        }
    }
    Ok(Some(opt))
}
