//! A trainer's weights handed over in memory (a transformers model's `state_dict()`,
//! by HF name) as a model the engine serves. Checked more strictly than a checkpoint
//! folder, whose extra files are none of our business: here every name must be a
//! weight the model reads, so a state dict of another model fails instead of being
//! half taken.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use candle_core::{DType, Tensor};

use super::config::{ModelConfig, RopeStyle};
use super::error::ModelError;
use super::forward::Model;
use super::safetensors::hf_name;
use super::weights::{roles, Role};

impl Model {
    /// A model of `config`'s shape from `tensors` named as in an HF checkpoint
    /// (`model.layers.0.self_attn.q_proj.weight`, ...), in any float dtype (bf16 and
    /// f16 matrices stay half precision, as [`Model::from_hf_tensors`] keeps them).
    ///
    /// - A name the model does not read is an error naming it, and so is a missing or
    ///   misshapen tensor.
    /// - `lm_head.weight` of a model with tied embeddings (transformers keeps it in
    ///   the state dict as the embedding itself) is accepted when it equals
    ///   `model.embed_tokens.weight`, and not used; a different one is an error.
    /// - The weights are in HF's layout, so RoPE pairs dimensions half-split whatever
    ///   `config` says: a GGUF llama's config says interleaved, because llama.cpp
    ///   permuted its file's Q/K rows, and these rows are not permuted.
    pub fn from_hf_state_dict(
        mut config: ModelConfig,
        mut tensors: HashMap<String, Tensor>,
        label: &Path,
    ) -> Result<Model, ModelError> {
        let unusable = |name: &str, msg: String| ModelError::UnusableTensor {
            path: label.to_path_buf(),
            name: name.to_string(),
            msg,
        };
        let known: HashSet<String> = roles(&config).into_iter().map(hf_name).collect();
        let head = hf_name(Role::LmHead);
        if config.tie_word_embeddings {
            if let Some(given) = tensors.remove(&head) {
                let embedding = hf_name(Role::Embedding);
                if let Some(e) = tensors.get(&embedding) {
                    if !same_values(&given, e)? {
                        return Err(unusable(
                            &head,
                            format!(
                                "differs from {embedding}, but the served model ties its \
                                 output layer to the embedding"
                            ),
                        ));
                    }
                }
            }
        }
        let mut unknown: Vec<&String> = tensors.keys().filter(|n| !known.contains(*n)).collect();
        unknown.sort();
        if let Some(name) = unknown.first() {
            let more = match unknown.len() {
                1 => String::new(),
                n => {
                    let shown: Vec<&str> =
                        unknown[1..n.min(6)].iter().map(|s| s.as_str()).collect();
                    let rest = if n > 6 {
                        format!(" and {} more", n - 6)
                    } else {
                        String::new()
                    };
                    format!(" (nor are {}{rest})", shown.join(", "))
                }
            };
            return Err(unusable(
                name,
                format!("is not a weight of the served model{more}"),
            ));
        }
        config.rope_style = RopeStyle::HalfSplit;
        Model::from_hf_tensors(config, tensors, label)
    }
}

/// Whether two tensors hold the same values (a tied head handed over as a copy of
/// the embedding, in the same dtype or another).
fn same_values(a: &Tensor, b: &Tensor) -> Result<bool, ModelError> {
    if a.dims() != b.dims() {
        return Ok(false);
    }
    let (a, b) = if a.dtype() == b.dtype() {
        (a.clone(), b.clone())
    } else {
        (a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?)
    };
    let equal = a
        .eq(&b)?
        .to_dtype(DType::U32)?
        .sum_all()?
        .to_scalar::<u32>()?;
    Ok(equal as usize == a.elem_count())
}
